"""Step time of every arm against stock, interleaved, and its summary.

A sample holds three figures (four for mixed steps) of `steps` consecutive `LLMEngine.step()` calls
of a decode batch of `bs` requests (after `warm` steps of prefill and first
decodes): decode steps, MTP verify iterations under an MTP serving
configuration, or mixed steps (a prefill chunk beside the decodes: Plan):
- step_s: their mean wall time, the GPU synchronized only at both ends: the
  period of back-to-back decode steps, what a user sees as inter-token
  latency, host and GPU together;
- forward_s: the median over those steps of the model runner's
  execute_model as the GPU's timeline sees it (CUDA events, spans.py's
  ForwardSpans), without the scheduler's and sampler's host time;
- replay_s: the median over those steps of the GPU time of the step's CUDA
  graph replays (spans.py's ReplaySpans): torch's replay prologue (two fill
  kernels, for a graph that draws) and the graph, one launch, back to back
  behind a spin that lets the host enqueue them first; for the reset design's
  arms, whose graphs draw nothing, from before the seed draw that precedes each
  replay (worker._time_replays_from_the_draw): under FULL graphs, where stock's
  seed draws are inside the graph and the reset design's just before it, and
  what the microbenchmark's graph mode times;
- forward_gpu_s (mixed steps): the median over the steps of the forward's GPU
  time (the runner's `with set_forward_context(...)`: the seed draws, the
  piecewise replays and the eager SSU between them), timed in segments, each
  behind a spin that lets the host enqueue it first (spans.py's
  ForwardGpuSpans): the forward's kernels back to back, as replay_s times a
  FULL graph's.
Under TP every rank times its own forwards and replays; a step's figure is
its slowest rank's (spans.py's merge_spans: the ranks wait for each other in
every all-reduce; forward_gpu_s is the fastest's: merge_forward_gpu), and a
sample also keeps each rank's median replay (rank_replay_s) and the spread
between ranks (replay_spread_s), tabulated by report.py.
step_s and forward_s carry the host's time (a decode step is host-bound:
the GPU waits on the host inside execute_model), with IQRs of hundreds of µs;
replay_s resolves µs (bench/results/engine-harness-history.md).  The engines
run with arms.DETERMINISTIC_ENV and, compiled, Inductor's deterministic mode
(arms.compilation_config), as the identity check's do, and the run's first
engine starts alone, so that every later one reads its Triton autotuning picks
of the Mamba kernels (autotune.py); Inductor's kernels are each arm's compile
cache's.  timing.json's "autotune" keeps each engine's picks of both, and the
report names the kernels whose pick differs between engines.
Each round takes one sample of every (arm, batch size) of one runner, in an
order shuffled by `random.Random(seed, runner, round)`, so drift over the
run falls on every arm alike and no arm keeps the same neighbour. Intervals
are percentile bootstraps over rounds (bench/stats.py), paired: a resample
takes the same rounds for every arm, so the saving against stock keeps what
a round's arms share.
An offset that one engine process keeps (its allocations, its compiled
code's placement) is in every sample of that engine, and no round averages
it out: with Plan.rounds_per_engine, every engine of the runner is closed and
started again after that many rounds, each sample names its engine, and the
summary gives the spread of the engines' medians (engine_spread).  Each sample
also carries its engine's start, in seconds (start_s: the `start` call, a
start_all's engines side by side but for the run's first, which starts alone),
which report.py tabulates per arm.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .. import stats
from . import autotune
from .arms import (
    BATCH_SIZES,
    DETERMINISTIC_ENV,
    FLOOR,
    FLOOR_RNG,
    PLAIN,
    SERVING_BY_NAME,
    STOCK,
    Arm,
    GraphMode,
    Runner,
)
from .client import WorkerError
from .envs import ROUNDS_ENV, ROUNDS_PER_ENGINE_ENV, TIMING_SERVING_ENV, WORKLOAD_ENV
from .session import (
    PROFILE_ENV,
    Settings,
    close_all,
    profile_batch_sizes_from_env,
    spawn_all,
    write_json,
)


@dataclass(frozen=True)
class Plan:
    # replay_s, the figure that resolves µs, is a median over the sample's
    # steps of one graph's GPU time, so 24 steps do (a sample takes about 0.5 s).
    rounds: int = 10
    steps: int = 24
    warm: int = 4
    seed: int = 0
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    # After the rounds, each engine's GPU kernels over `steps` steps of the
    # workload at these batch sizes (worker.py's profile): which kernels an
    # arm adds or drops against stock's, which the timing alone cannot say.
    profile_batch_sizes: tuple[int, ...] = ()
    # The engines' serving configuration (arms.SERVINGS: mtp7 times MTP
    # verify iterations) and the steps timed: "decode", or "mixed" (a
    # prefill chunk beside the decodes: worker.py's mixed).
    serving: str = PLAIN.name
    workload: str = "decode"
    # The engines' step budget (arms.step_tokens_kwargs); None: engine_kwargs'.
    step_tokens: int | None = None
    # The rounds each engine takes before every engine of the runner starts
    # again (run); None: one engine per arm for all rounds.
    rounds_per_engine: int | None = None

    def __post_init__(self) -> None:
        if self.rounds_per_engine is not None and self.rounds_per_engine < 1:
            raise ValueError(
                f"{ROUNDS_PER_ENGINE_ENV} takes a number of rounds, at least 1; "
                f"got {self.rounds_per_engine}"
            )
        if self.serving not in SERVING_BY_NAME:
            raise ValueError(
                f"{TIMING_SERVING_ENV} takes one of {', '.join(SERVING_BY_NAME)}; "
                f"got {self.serving!r}"
            )
        if self.workload not in WORKLOADS:
            raise ValueError(
                f"{WORKLOAD_ENV} takes one of {', '.join(WORKLOADS)}; got {self.workload!r}"
            )
        if not set(self.profile_batch_sizes) <= set(self.batch_sizes):
            raise ValueError(
                f"{PROFILE_ENV} takes batch sizes the {self.workload} timing measures "
                f"({', '.join(map(str, self.batch_sizes))}); got {self.profile_batch_sizes}"
            )
        if self.step_tokens is not None and SERVING_BY_NAME[self.serving].prefix_caching:
            raise ValueError(
                f"{TIMING_SERVING_ENV}={self.serving} caches prefixes in align mode, whose "
                f"step budget must hold a block: a step budget of {self.step_tokens} tokens "
                f"({WORKLOAD_ENV}=mixed) cannot; time mixed steps under a serving without "
                "prefix caching"
            )

    @classmethod
    def from_env(cls) -> Plan:
        """The plan test_engine_step.py runs: SR_ENGINE_ROUNDS, SR_ENGINE_PROFILE,
        SR_ENGINE_TIMING_SERVING (default plain), SR_ENGINE_WORKLOAD (default
        decode; mixed times MIXED_STEPS steps of MIXED_BATCH_SIZES decodes in
        MIXED_STEP_TOKENS tokens) and SR_ENGINE_ROUNDS_PER_ENGINE (default: one
        engine for all rounds of decode steps, MIXED_ROUNDS_PER_ENGINE of mixed)."""
        workload = os.environ.get(WORKLOAD_ENV) or "decode"
        mixed = workload == "mixed"
        per_engine = os.environ.get(ROUNDS_PER_ENGINE_ENV, "").strip()
        if per_engine and not per_engine.isdigit():
            raise ValueError(
                f"{ROUNDS_PER_ENGINE_ENV} takes a number of rounds, at least 1; got {per_engine!r}"
            )
        return cls(
            rounds=int(os.environ.get(ROUNDS_ENV) or cls.rounds),
            profile_batch_sizes=profile_batch_sizes_from_env(),
            serving=os.environ.get(TIMING_SERVING_ENV) or PLAIN.name,
            workload=workload,
            batch_sizes=MIXED_BATCH_SIZES if mixed else BATCH_SIZES,
            steps=MIXED_STEPS if mixed else cls.steps,
            step_tokens=MIXED_STEP_TOKENS if mixed else None,
            rounds_per_engine=(
                int(per_engine) if per_engine else MIXED_ROUNDS_PER_ENGINE if mixed else None
            ),
        )

    @property
    def tag(self) -> str:
        """What the run's files add to their names: "" for plain
        decode steps (timing.json), else e.g. "-mtp7" or "-mixed"."""
        parts = [self.serving] if self.serving != PLAIN.name else []
        parts += [self.workload] if self.workload != "decode" else []
        return "".join(f"-{part}" for part in parts)


WORKLOADS = ("decode", "mixed")
# A mixed step's batch sizes: one of max_num_seqs' 8 slots prefills.
MIXED_BATCH_SIZES = (1, 2, 4)
# A mixed step's tokens: its decodes and a prefill chunk of the rest, on the
# piecewise graphs captured at this size.  Small: the saving is per forward (N
# seed draws) whatever the chunk, and a shorter forward varies less around it.
MIXED_STEP_TOKENS = 128
# Steps per burst of a mixed sample (worker.py's mixed times two bursts):
# forward_gpu_s is a median of one forward's GPU time, as replay_s is.
MIXED_STEPS = 12
# A new engine per round of mixed steps: their forward_gpu_s varies by a few µs
# within one engine but can differ between engine processes by more than the
# draws' saving (bench/results/engine-nvidia-h200-20261201e.md).  Decode steps'
# replay_s differs between engines by a few µs; a decode run keeps one engine.
MIXED_ROUNDS_PER_ENGINE = 1


Samples = dict[int, dict[str, list[dict[str, float]]]]
"""samples[bs][arm]: one dict of figures per round, e.g. {"step_s": ..., "forward_s": ...,
"engine": 0} (run's engine of the arm that took it, numbered from 0)."""


def interleave(
    arms: Sequence[str],
    plan: Plan,
    runner: str,
    sample: Callable[[str, int], Mapping[str, float]],
    after_round: Callable[[Samples], None] = lambda _: None,
    before_round: Callable[[int], Sequence[str]] | None = None,
) -> Samples:
    """One `sample(arm, bs)` of every (arm, batch size) per round, in shuffled
    order; `before_round(i)`, where given, runs before round i and returns
    which of `arms` that round measures."""
    samples: Samples = {bs: {arm: [] for arm in arms} for bs in plan.batch_sizes}
    for round_index in range(plan.rounds):
        measured = arms if before_round is None else before_round(round_index)
        order = [(arm, bs) for arm in measured for bs in plan.batch_sizes]
        stats.seeded_rng(plan.seed, runner, round_index).shuffle(order)
        for arm, bs in order:
            samples[bs][arm].append(dict(sample(arm, bs)))
        after_round(samples)
    return samples


def column(samples: Samples, figure: str) -> dict[int, dict[str, list[float]]]:
    """One figure of every sample, where the sample has it."""
    return {
        bs: {
            arm: [s[figure] for s in rows if s.get(figure) is not None]
            for arm, rows in per_arm.items()
        }
        for bs, per_arm in samples.items()
    }


def _ratio(stock: float, arm: float) -> float:
    return arm / stock


def _recovered(stock: float, arm: float, floor: float) -> float | None:
    return None if stock <= floor else (stock - arm) / (stock - floor)


def _us(interval: stats.Interval | None) -> list[float] | None:
    return None if interval is None else [round(v * 1e6, 2) for v in interval]


def summarize(
    samples: Mapping[str, Sequence[float]], stock: str, runner: str, bs: int
) -> dict[str, dict]:
    """Per arm: median µs per step, its 95% CI and IQR; the µs saved against
    stock and the ratio to stock, with paired 95% intervals; where the floor
    arm ran, the share of the draws' cost (stock - floor) the arm saves
    ("recovered"), and where floor-rng ran, the share of what a drawing path
    can save (stock - floor-rng: "recovered_rng"), each with its paired interval."""
    present = {arm: list(values) for arm, values in samples.items() if values}
    boot = stats.bootstrap_medians(
        present, rng=stats.seeded_rng(stats.BOOTSTRAP_SEED, "engine", runner, bs)
    )
    enough = all(len(v) >= stats.MIN_SAMPLES for v in present.values())
    rows: dict[str, dict] = {}
    base = statistics.median(present[stock]) if stock in present else None
    for arm, values in present.items():
        median = statistics.median(values)
        row = {
            "samples": len(values),
            "median_us": round(median * 1e6, 2),
            "median_ci95_us": _us(stats.percentile_interval(boot[arm])) if enough else None,
            "iqr_us": _us(stats.quartiles(values)),
        }
        if base is not None and arm != stock:
            row["saved_us"] = round((base - median) * 1e6, 2)
            row["saved_ci95_us"] = (
                _us(stats.interval_of([boot[stock], boot[arm]], lambda s, a: s - a))
                if enough
                else None
            )
            row["ratio_to_stock"] = round(median / base, 4)
            row["ratio_ci95"] = (
                [round(v, 4) for v in ratio]
                if enough and (ratio := stats.interval_of([boot[stock], boot[arm]], _ratio))
                else None
            )
            # The share of what the draws cost (stock's median over a floor's)
            # that the arm saves, against each floor that ran.
            for floor, name in ((FLOOR.name, "recovered"), (FLOOR_RNG.name, "recovered_rng")):
                if floor not in present or arm in (FLOOR.name, FLOOR_RNG.name):
                    continue
                cost = base - statistics.median(present[floor])
                row[name] = round((base - median) / cost, 4) if cost > 0 else None
                share = (
                    stats.interval_of([boot[stock], boot[arm], boot[floor]], _recovered)
                    if enough
                    else None
                )
                row[f"{name}_ci95"] = None if not share else [round(v, 4) for v in share]
        rows[arm] = row
    return rows


def by_engine(rows: Sequence[Mapping[str, float]], figure: str) -> dict[int, list[float]]:
    """engine -> `figure` of its samples among `rows`, in engine order (a
    sample without "engine" is engine 0's)."""
    values: dict[int, list[float]] = {}
    for s in rows:
        if s.get(figure) is not None:
            values.setdefault(int(s.get("engine", 0)), []).append(s[figure])
    return dict(sorted(values.items()))


def engine_spread(samples: Samples) -> dict[str, dict[str, dict[str, dict]]] | None:
    """Per figure, batch size and arm: each engine's sample count ("rounds")
    and median, and the spread of those medians (max - min), in µs; None
    where every arm's samples are one engine's."""
    spread: dict[str, dict[str, dict[str, dict]]] = {}
    several = False
    for name, figure in FIGURES.items():
        per_bs: dict[str, dict[str, dict]] = {}
        for bs, per_arm in samples.items():
            rows = {}
            for arm, arm_samples in per_arm.items():
                values = by_engine(arm_samples, figure)
                if not values:
                    continue
                medians = [statistics.median(v) for v in values.values()]
                several |= len(medians) > 1
                rows[arm] = {
                    "rounds": [len(v) for v in values.values()],
                    "median_us": [round(m * 1e6, 2) for m in medians],
                    "spread_us": round((max(medians) - min(medians)) * 1e6, 2),
                }
            if rows:
                per_bs[str(bs)] = rows
        if per_bs:
            spread[name] = per_bs
    return spread if several else None


def runner_result(samples: Samples, runner: str) -> dict[str, Any]:
    """One runner's samples and, per figure and batch size, their summary;
    with several engines per arm, also their spread ("engines": engine_spread)."""
    engines = engine_spread(samples)
    return {
        "samples": {str(bs): per_arm for bs, per_arm in samples.items()},
        "summary": {
            name: {
                str(bs): summarize(per_arm, STOCK.name, f"{runner}-{name}", bs)
                for bs, per_arm in column(samples, figure).items()
            }
            for name, figure in FIGURES.items()
        },
        **({"engines": engines} if engines else {}),
    }


def picks_per_rank(picks: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """arm/runner/engine -> [each rank's picks], as engine/rank<r> -> that rank's picks
    (an engine whose picks could not be read, {"error": ...}, is left out)."""
    return {
        f"{engine}/rank{rank}": picked
        for engine, ranks in picks.items()
        if isinstance(ranks, list)
        for rank, picked in enumerate(ranks)
    }


FIGURES = {
    "step": "step_s",
    "forward": "forward_s",
    "replay": "replay_s",
    "forward-gpu": "forward_gpu_s",
}


def run(
    settings: Settings, plan: Plan, spawn: Callable[..., dict] = spawn_all
) -> tuple[dict[str, Any], dict[tuple[str, str], Any]]:
    """Starts a FULL_AND_PIECEWISE engine of plan.serving per (arm, runner)
    (again every plan.rounds_per_engine rounds of its runner), measures the
    runners one after the other, writes settings.out / f"timing{plan.tag}.json";
    returns its data and the workers (the last engines, still running: the
    caller closes them)."""
    pairs = [(arm, runner) for runner in settings.runners for arm in settings.timing_arms]
    # As the identity check runs them: the same compiled code in every arm
    # (no config picked by timing under load), and its compile cache reused.
    workers = spawn(pairs, settings, "timing", DETERMINISTIC_ENV)
    failed: dict[str, str] = {}
    # (arm, runner, engine) -> the seconds its start call took; every sample of that
    # engine carries it (start_s).  The engines of a start_all start side by side,
    # but for the run's first, which starts alone.
    start_s: dict[tuple[str, str, int], float] = {}
    # (arm/runner/engine) -> each rank's Triton autotuning picks after its start.
    picks: dict[str, Any] = {}

    def start_all(started: list[tuple[Arm, Runner]], engine: int) -> None:
        # The engines start at once (kv_cache_memory_bytes skips vLLM's memory
        # profiling, so engines on one GPU can); a failure is recorded.  The
        # run's first start leads alone: the Mamba-2 SSD kernels it autotunes in
        # its profile run are every later engine's, read from Triton's cache
        # (autotune.py), and not picked under the others' load.
        def start(pair: tuple[Arm, Runner]) -> None:
            arm, runner = pair
            worker = workers[arm.name, runner.value]
            try:
                if isinstance(worker, Exception):
                    raise worker
                began = time.monotonic()
                worker.call(
                    "start",
                    mode=GraphMode.FULL_AND_PIECEWISE.value,
                    serving=plan.serving,
                    step_tokens=plan.step_tokens,
                )
                start_s[arm.name, runner.value, engine] = round(time.monotonic() - began, 1)
            except Exception as error:
                which = f"engine {engine}: " if engine else ""
                failed[f"{arm.name}/{runner.value}"] = f"{which}{type(error).__name__}: {error}"
                return
            # A diagnosis, as the profile: its failure leaves the engine measured.
            try:
                picks[f"{arm.name}/{runner.value}/{engine}"] = worker.call("autotune")["picks"]
            except WorkerError as error:
                picks[f"{arm.name}/{runner.value}/{engine}"] = {"error": str(error)}

        leader, rest = (started[:1], started[1:]) if engine == 0 else ([], started)
        for pair in leader:
            start(pair)
        with ThreadPoolExecutor(max_workers=max(1, len(rest))) as pool:
            list(pool.map(start, rest))

    def restart(runner: Runner, up: Sequence[str], engine: int) -> list[str]:
        """Closes the runner's engines of the arms `up` and starts new ones,
        numbered `engine` (their logs under timing-engine<engine>); returns the
        arms whose new engine started."""
        again = [(arm, runner) for arm in settings.timing_arms if arm.name in up]
        close_all({(arm.name, runner.value): workers[arm.name, runner.value] for arm, _ in again})
        workers.update(spawn(again, settings, f"timing-engine{engine}", DETERMINISTIC_ENV))
        start_all(again, engine)
        return [arm.name for arm, _ in again if f"{arm.name}/{runner.value}" not in failed]

    def measure(runner: Runner) -> dict[str, Any]:
        up = [
            arm.name for arm in settings.timing_arms if f"{arm.name}/{runner.value}" not in failed
        ]
        arms, engine = list(up), 0

        def before_round(round_index: int) -> list[str]:
            nonlocal up, engine
            every = plan.rounds_per_engine
            if every and round_index and round_index % every == 0:
                engine = round_index // every
                up = restart(runner, up, engine)
            return up

        def sample(arm: str, bs: int) -> dict:
            worker = workers[arm, runner.value]
            figures = worker.call(plan.workload, bs=bs, steps=plan.steps, warm=plan.warm)
            started = start_s.get((arm, runner.value, engine))
            return {**figures, "engine": engine, "start_s": started}

        def partial(samples: Samples) -> None:
            write_json(settings.out / f"timing-{runner.value}{plan.tag}-partial.json", samples)

        def profile(worker: Any, bs: int) -> dict:
            # A profile is a diagnosis after the rounds: its failure (the
            # profiler's, on that engine) leaves the figures as they are.
            try:
                return worker.call(
                    "profile", bs=bs, steps=plan.steps, warm=plan.warm, workload=plan.workload
                )
            except WorkerError as error:
                return {"error": str(error)}

        samples = interleave(arms, plan, runner.value, sample, partial, before_round)
        ready = {arm: workers[arm, runner.value] for arm in up}
        profiles = {
            arm: {str(bs): profile(worker, bs) for bs in plan.profile_batch_sizes}
            for arm, worker in ready.items()
        }
        return {
            **runner_result(samples, runner.value),
            "engagement": {arm: w.engagement() for arm, w in ready.items()},
            **({"profile": profiles} if plan.profile_batch_sizes else {}),
        }

    try:
        # No kernel is picked by timing per arm: Inductor's are deterministic
        # (compilation_config), and the Triton autotuning of the prefill kernels
        # is the first engine's (start_all).  The runners are measured one after
        # the other, so that one's host work does not add to the other's spread.
        start_all(pairs, 0)
        results = {runner.value: measure(runner) for runner in settings.runners}
    except BaseException:
        close_all(workers)
        raise
    data = {
        "runners": results,
        "failed": failed,
        "plan": vars(plan),
        "gpus": list(settings.gpus),
        "tp": settings.tp,
        "mode": GraphMode.FULL_AND_PIECEWISE.value,
        "serving": plan.serving,
        "workload": plan.workload,
        "autotune": {"picks": picks, "differences": autotune.differences(picks_per_rank(picks))},
    }
    write_json(settings.out / f"timing{plan.tag}.json", data)
    return data, workers
