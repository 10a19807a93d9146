"""Every environment variable the serve harness reads, with its default and meaning, in
one table (as bench/engine/envs.py keeps the engine harness's); `python -m
bench.serve.envs` prints it.

tests/gpu/vllm/engine.sh serve sets SR_ENGINE_SITES (the arms' vLLM copies) and
SR_SERVE_RESUME; the others shrink or widen what a run covers.
"""

from __future__ import annotations

from bench.engine import envs as engine_envs
from bench.engine.envs import Variable

RUNNERS_ENV = "SR_SERVE_RUNNERS"
ARMS_ENV = "SR_SERVE_ARMS"
PAIRS_ENV = "SR_SERVE_PAIRS"
CONTROL_PAIRS_ENV = "SR_SERVE_CONTROL_PAIRS"
CONCURRENCY_ENV = "SR_SERVE_CONCURRENCY"
NUM_PROMPTS_ENV = "SR_SERVE_NUM_PROMPTS"
INPUT_LEN_ENV = "SR_SERVE_INPUT_LEN"
OUTPUT_LEN_ENV = "SR_SERVE_OUTPUT_LEN"
LONG_ENV = "SR_SERVE_LONG"
LONG_PAIRS_ENV = "SR_SERVE_LONG_PAIRS"
BLOCKS_ENV = "SR_SERVE_BLOCKS"
WARMUPS_ENV = "SR_SERVE_WARMUPS"
IDENTITY_ENV = "SR_SERVE_IDENTITY"
KV_CACHE_DTYPE_ENV = "SR_SERVE_KV_CACHE_DTYPE"
WEIGHTS_ENV = "SR_SERVE_WEIGHTS"
SPEC_TOKENS_ENV = "SR_SERVE_SPEC_TOKENS"
KV_CACHE_BYTES_ENV = "SR_SERVE_KV_CACHE_BYTES"
EXTRA_ARGS_ENV = "SR_SERVE_EXTRA_ARGS"
TORCH_DETERMINISTIC_ENV = "SR_SERVE_TORCH_DETERMINISTIC"
START_TIMEOUT_ENV = "SR_SERVE_START_TIMEOUT"
BUDGET_ENV = "SR_SERVE_BUDGET_S"
RESUME_ENV = "SR_SERVE_RESUME"
DEPS_ENV = "SR_SERVE_DEPS"
RECORDS_ENV = "SR_SERVE_RECORDS"
PAIRED_ARGS_ENV = "SR_SERVE_PAIRED_ARGS"
WEIGHTS_WORKER_ENV = "SR_SERVE_WORKER_WEIGHTS"

VARIABLES: tuple[Variable, ...] = (
    Variable(
        RUNNERS_ENV,
        "v1",
        "v1,v2: the runners (VLLM_USE_V2_MODEL_RUNNER=0/1), one after the other",
        "settings.py",
    ),
    Variable(
        ARMS_ENV,
        "stock,reset,forward-context",
        "the measured arms, in each round's block order (and start order where they start "
        "one after another); their servers stay up together through the round",
        "settings.py",
    ),
    Variable(
        PAIRS_ENV,
        "2",
        "rounds (1..N), each on fresh servers of all arms; a resumed run adds the rounds it lacks",
        "settings.py",
    ),
    Variable(
        CONTROL_PAIRS_ENV,
        "1",
        "the rounds that also start the one-seed control's server (identity only, no bench); "
        "empty: none",
        "settings.py",
    ),
    Variable(
        CONCURRENCY_ENV,
        "1,8",
        "the random shapes' --max-concurrency values (the issue's 1,2,4,8 by resume)",
        "settings.py",
    ),
    Variable(
        NUM_PROMPTS_ENV,
        "16",
        "requests per concurrency shape (at least 2 x the concurrency are sent)",
        "settings.py",
    ),
    Variable(
        INPUT_LEN_ENV,
        "1024",
        "prompt tokens of the concurrency shapes (random dataset)",
        "settings.py",
    ),
    Variable(
        OUTPUT_LEN_ENV, "128", "output tokens of every shape (--ignore-eos, fixed)", "settings.py"
    ),
    Variable(
        LONG_ENV,
        "1",
        "1: also the seed document's shape (10 requests of 10000-token prompts, concurrency "
        "1); 0: not",
        "settings.py",
    ),
    Variable(LONG_PAIRS_ENV, "all", "the rounds that run the long shape (e.g. 1)", "settings.py"),
    Variable(
        BLOCKS_ENV,
        "4",
        "vllm bench serve runs per arm and shape in a round, one block after another, each "
        "block over the arms' resident servers in turn: stock, reset, forward-context, then "
        "reversed, ... (1 or more)",
        "settings.py",
    ),
    Variable(WARMUPS_ENV, "2", "vllm bench serve --num-warmups before each block", "settings.py"),
    Variable(
        IDENTITY_ENV,
        "1",
        "1: the identity requests on every server, before the shapes; 0: not",
        "settings.py",
    ),
    Variable(
        KV_CACHE_DTYPE_ENV,
        "fp8",
        "--kv-cache-dtype (auto: the model's); where fp8 fails to start, the run falls back to "
        "auto once and says so",
        "settings.py",
    ),
    Variable(
        WEIGHTS_ENV,
        "random",
        "random: load_format dummy, then the bench's redraw at working scale "
        "(bench.engine.model.init_weights; the state is not ~0, so the control can differ); "
        "dummy: vLLM's dummy weights as loaded",
        "settings.py",
    ),
    Variable(SPEC_TOKENS_ENV, "7", "MTP speculative tokens (0: no drafter)", "settings.py"),
    Variable(
        KV_CACHE_BYTES_ENV,
        "17179869184",
        "--kv-cache-memory-bytes of every server (the KV cache's size; the round's resident "
        "servers each hold one)",
        "settings.py",
    ),
    Variable(
        EXTRA_ARGS_ENV, "none", "more vllm serve arguments, shell-split, appended", "settings.py"
    ),
    Variable(
        TORCH_DETERMINISTIC_ENV,
        "0",
        "1/nofill: torch's deterministic algorithms in every server (as the engine identity "
        "run; costs time in every arm alike)",
        "settings.py",
    ),
    Variable(
        START_TIMEOUT_ENV, "480", "seconds a server may take to answer /health", "settings.py"
    ),
    Variable(
        BUDGET_ENV,
        "none",
        "seconds this run may take: a round's servers start only where their guessed starts "
        "and a block fit (each arm's last start here, else 90 s after its warm-up, else 210 s; "
        "the longest where they launch together, the sum otherwise), else they warm up first "
        "where one start fits; a block runs only where the slowest block so far fits",
        "run.py",
    ),
    Variable(
        RESUME_ENV,
        "unset (engine.sh: /tmp/sr-engine/serve-<stamp>.json)",
        "the records of earlier runs of the same code on this machine: parts recorded there "
        "without error are not run again",
        "records.py",
    ),
    Variable(
        DEPS_ENV,
        "/tmp/serve-site",
        "where tests/gpu/vllm/stage-serve.sh put what vllm serve needs beyond the bundle: on "
        "every server's PYTHONPATH after the arm's vLLM",
        "server.py",
    ),
    Variable(
        PAIRED_ARGS_ENV,
        "--a stock --b stock --runs 2",
        "engine.sh paired: the options of `python -m bench.serve.paired run` (arms, runs, "
        "pairs, runner, spec tokens, --no-async-scheduling, ...; --help lists them)",
        "tests/gpu/vllm/engine.sh",
    ),
    Variable(
        RECORDS_ENV,
        "unset",
        "a serve.json or committed bench/results/*.serve.json that bench/serve/test_judge.py "
        "judges",
        "test_judge.py",
    ),
    Variable(
        WEIGHTS_WORKER_ENV,
        "set by server.py",
        "random or dummy, for the servers' vLLM worker (serve_worker.py)",
        "serve_worker.py",
    ),
)
BY_NAME = {variable.name: variable for variable in VARIABLES}


def table() -> str:
    """The variables as a markdown table."""
    return engine_envs.table(VARIABLES)


if __name__ == "__main__":
    print(table(), end="")
