"""Step time of the patched vLLM engine against stock: pytest-benchmark.

The session (timing.py's run) starts one engine per (arm, runner) with
FULL_AND_PIECEWISE graphs, the V1 engines on one GPU group and the V2 engines on
the next where there are two (SR_ENGINE_GPUS), and takes interleaved rounds of
every arm and batch size, one runner after the other, starting the runner's
engines again every SR_ENGINE_ROUNDS_PER_ENGINE rounds (timing.Plan).  The steps
are decode steps of the serving configuration SR_ENGINE_TIMING_SERVING names
(plain by default; mtp3 or mtp7: MTP verify iterations), or, with
SR_ENGINE_WORKLOAD=mixed, steps that prefill a chunk beside the decodes
(timing.Plan.from_env).  Its figures (timing.FIGURES: the step's wall time, the
forward's and the graph replays' GPU time; median, 95% CI, IQR, µs saved against
stock and ratio, with paired intervals) go into each test's `extra_info` and
$OUT/engine/timing<tag>.json (timing.Plan.tag).  What pytest-benchmark itself
times is one such sample (a burst of timing.Plan.steps steps) of that arm alone,
once, for `--benchmark-compare` between runs of the same arm.

Run on the GPU machine by tests/gpu/vllm/engine.sh; skipped elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .arms import BATCH_SIZES, NAMED_ONLY_ARMS, TIMING_ARMS, Runner
from .session import SKIP_REASON, Settings, close_all
from .timing import FIGURES, Plan, run

pytest.importorskip("pytest_benchmark", reason="the bench needs pytest-benchmark")
pytestmark = pytest.mark.gpu

PLAN = Plan.from_env()


@pytest.fixture(scope="module")
def timing() -> Iterator[dict[str, Any]]:
    settings = Settings.from_env()
    if settings is None:
        pytest.skip(SKIP_REASON)
    data, workers = run(settings, PLAN)
    try:
        yield {**data, "workers": workers}
    finally:
        close_all(workers)


@pytest.mark.parametrize("bs", BATCH_SIZES)
@pytest.mark.parametrize("runner", list(Runner), ids=lambda r: r.value)
@pytest.mark.parametrize("arm", [arm.name for arm in (*TIMING_ARMS, *NAMED_ONLY_ARMS)])
def test_decode_step(benchmark, timing, arm: str, runner: Runner, bs: int) -> None:
    if bs not in PLAN.batch_sizes:
        pytest.skip(f"batch size {bs} not in the {PLAN.workload} workload's {PLAN.batch_sizes}")
    if runner.value not in timing["runners"]:
        pytest.skip(f"{runner.value} not measured in this run (SR_ENGINE_RUNNERS)")
    if (arm, runner.value) not in timing["workers"]:
        pytest.skip(f"{arm} not measured in this run (SR_ENGINE_ARMS)")
    if f"{arm}/{runner.value}" in timing["failed"]:
        pytest.fail(timing["failed"][f"{arm}/{runner.value}"], pytrace=False)
    summary = timing["runners"][runner.value]["summary"]
    benchmark.extra_info.update(
        {name: summary[name][str(bs)].get(arm) for name in FIGURES},
        runner=runner.value,
        batch_size=bs,
        arm=arm,
        serving=PLAN.serving,
        workload=PLAN.workload,
    )
    worker = timing["workers"][arm, runner.value]
    benchmark.pedantic(
        lambda: worker.call(PLAN.workload, bs=bs, steps=PLAN.steps, warm=PLAN.warm),
        rounds=1,
        iterations=1,
    )
