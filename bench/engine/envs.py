"""Every environment variable the engine harness reads: its name, default and meaning,
in one table (as vLLM's vllm/envs.py keeps vLLM's).  The modules that read one take its
name from here; `python -m bench.engine.envs` prints the table.

The harness's runs are started by tests/gpu/vllm/engine.sh, which sets SR_ENGINE_SITES,
SR_ENGINE_GPUS and SR_ENGINE_RESUME; the others pick what a run covers.  OUT (default
/tmp/out) is where results and engine logs go.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    meaning: str
    read_by: str


SITES_ENV = "SR_ENGINE_SITES"
GPUS_ENV = "SR_ENGINE_GPUS"
TP_ENV = "SR_ENGINE_TP"
RUNNERS_ENV = "SR_ENGINE_RUNNERS"
ARMS_ENV = "SR_ENGINE_ARMS"
IDENTITY_ARMS_ENV = "SR_ENGINE_IDENTITY_ARMS"
MODES_ENV = "SR_ENGINE_MODES"
SERVING_ENV = "SR_ENGINE_SERVING"
PROFILE_ENV = "SR_ENGINE_PROFILE"
TIMING_SERVING_ENV = "SR_ENGINE_TIMING_SERVING"
WORKLOAD_ENV = "SR_ENGINE_WORKLOAD"
ROUNDS_ENV = "SR_ENGINE_ROUNDS"
ROUNDS_PER_ENGINE_ENV = "SR_ENGINE_ROUNDS_PER_ENGINE"
RESUME_ENV = "SR_ENGINE_RESUME"
RECORDS_ENV = "SR_ENGINE_RECORDS"
ARM_ENV = "SR_ENGINE_ARM"
LLM_KWARGS_ENV = "SR_ENGINE_LLM_KWARGS"
TORCH_DETERMINISTIC_ENV = "SR_ENGINE_TORCH_DETERMINISTIC"

VARIABLES: tuple[Variable, ...] = (
    Variable(
        SITES_ENV,
        "unset (the runs skip)",
        "copy=path,...: the vLLM copies (stock, reset, forward-context), staged by "
        "tests/gpu/vllm/engine.sh",
        "client.py",
    ),
    Variable(
        GPUS_ENV,
        "0",
        "GPUs, in groups of SR_ENGINE_TP; with two groups, V1 engines use the first, V2 the second",
        "session.py",
    ),
    Variable(
        TP_ENV,
        "1",
        "1, 2, 4 or 8: tensor-parallel size of every engine, one process per rank, each "
        "rank one TP4 rank's work (model.model_config)",
        "session.py",
    ),
    Variable(
        RUNNERS_ENV,
        "both; V1 alone on a vLLM whose V2 runner refuses hybrid models",
        "v1,v2: the runners the timing measures and the identity run judges (one "
        "runner fits a device call of 10 minutes)",
        "session.py",
    ),
    Variable(
        ARMS_ENV,
        "all of arms.TIMING_ARMS",
        "stock,floor,...: the arms the timing measures; stock is always among them "
        "(older names, compact.RENAMES, are taken too); arms.NAMED_ONLY_ARMS run "
        "only where named",
        "session.py",
    ),
    Variable(
        IDENTITY_ARMS_ENV,
        "all of arms.IDENTITY_ARMS",
        "reset,...: the identity run's arms; stock and stock-again, the positive "
        "control, always run (older names, compact.RENAMES, are taken too); "
        "arms.NAMED_ONLY_ARMS (the plugin) run only where named",
        "session.py",
    ),
    Variable(
        MODES_ENV,
        "all of identity.MODES",
        "eager,FULL_AND_PIECEWISE: the identity run's graph modes",
        "session.py",
    ),
    Variable(
        SERVING_ENV,
        "plain",
        "mtp7,prefix,...: the identity run's serving configurations (arms.SERVINGS), "
        "each in every mode of SR_ENGINE_MODES",
        "session.py",
    ),
    Variable(
        PROFILE_ENV,
        "none",
        "1,8: after the timing's rounds, each engine's GPU kernels at these batch sizes "
        "(timing.Plan.profile_batch_sizes)",
        "session.py",
    ),
    Variable(
        TIMING_SERVING_ENV,
        "plain",
        "the timing engines' serving configuration (mtp3, mtp7: MTP verify iterations)",
        "timing.py",
    ),
    Variable(
        WORKLOAD_ENV,
        "decode",
        "the timed steps: decode, or mixed (a prefill chunk beside BS 1/2/4 decodes, a "
        "step of timing.MIXED_STEP_TOKENS on piecewise graphs, and the forward's GPU "
        "time: worker.py's mixed)",
        "timing.py",
    ),
    Variable(ROUNDS_ENV, "timing.Plan.rounds", "the timing's rounds", "timing.py"),
    Variable(
        ROUNDS_PER_ENGINE_ENV,
        "one engine for all rounds of decode steps; a new one every round of mixed steps",
        "after that many rounds of a runner, its engines are closed and started again, "
        "so each arm is sampled from several engine processes",
        "timing.py",
    ),
    Variable(
        RESUME_ENV,
        "unset",
        "a JSON file of records from an earlier run of the same code on this machine "
        "(engine.sh keeps one in /tmp): cells recorded there without error are not run "
        "again, so a run cut off by a device call's time limit goes on where it stopped",
        "identity.py",
    ),
    Variable(
        RECORDS_ENV,
        "unset (the identity test runs the engines)",
        "an identity.json or committed bench/results/*.identity.json whose records "
        "tests/gpu/vllm/test_engine_identity.py judges instead, on any machine",
        "tests/gpu/vllm/test_engine_identity.py",
    ),
    Variable(
        ARM_ENV,
        "set by worker.py",
        "the arm's name, set by the worker before the engine starts, so every rank's "
        "process has it (worker.prepare_rank)",
        "worker.py",
    ),
    Variable(
        LLM_KWARGS_ENV,
        "{}",
        "LLM(...) arguments over arms.engine_kwargs', as JSON (a diagnostic's: "
        "bench/engine/reproduce.py)",
        "worker.py",
    ),
    Variable(
        TORCH_DETERMINISTIC_ENV,
        "unset",
        "torch's deterministic algorithms, set before vLLM loads: 1 with new "
        "allocations filled (NaN in floats, the largest integer in integers), nofill "
        "without (arms.IDENTITY_ENV sets 1)",
        "worker.py",
    ),
)
BY_NAME = {variable.name: variable for variable in VARIABLES}


def table(variables: tuple[Variable, ...] = VARIABLES) -> str:
    """The variables (the harness's by default) as a markdown table."""
    rows = ["| variable | default | meaning | read by |", "| --- | --- | --- | --- |"]
    rows += [f"| `{v.name}` | {v.default} | {v.meaning} | {v.read_by} |" for v in variables]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(table(), end="")
