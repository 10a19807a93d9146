"""Decode step time of the patched vLLM 0.26.0 engine against stock: pytest-benchmark.

The session (timing.py) starts one engine per (arm, runner) with
FULL_AND_PIECEWISE graphs, the V1 engines on one GPU and the V2 engines on
the other where there are two (SR_ENGINE_GPUS), and takes interleaved rounds
of every arm and batch size, one runner after the other.  Its figures for the
step's wall time and the forward's GPU time (median, 95% CI, IQR, µs saved
against stock and ratio, with paired intervals) go into each test's
`extra_info` and $OUT/engine/timing.json.  What pytest-benchmark
itself times is one such sample (a burst of decode steps) of that arm alone,
a few times, for `--benchmark-compare` between runs of the same arm.

Run on the GPU machine by tests/gpu/vllm/engine.sh; skipped elsewhere.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from .arms import ARMS, STOCK, GraphMode, Runner
from .client import Worker
from .session import SKIP_REASON, Settings, close_all, spawn_all, write_json
from .timing import Plan, Samples, column, interleave, summarize

pytest.importorskip("pytest_benchmark", reason="the bench needs pytest-benchmark")
pytestmark = pytest.mark.gpu

PLAN = Plan(rounds=int(os.environ.get("SR_ENGINE_ROUNDS", Plan.rounds)))


FIGURES = {"step": "step_s", "forward": "forward_s"}


@pytest.fixture(scope="module")
def timing() -> dict[str, Any]:
    settings = Settings.from_env()
    if settings is None:
        pytest.skip(SKIP_REASON)
    pairs = [(arm, runner) for runner in Runner for arm in ARMS]
    workers = spawn_all(pairs, settings, "timing")
    failed: dict[str, str] = {}

    def started(runner: Runner) -> dict[str, Worker]:
        ready = {}
        for arm in ARMS:
            worker = workers[arm.name, runner.value]
            try:
                if isinstance(worker, Exception):
                    raise worker
                worker.call("start", mode=GraphMode.FULL_AND_PIECEWISE.value)
                ready[arm.name] = worker
            except Exception as error:
                failed[f"{arm.name}/{runner.value}"] = f"{type(error).__name__}: {error}"
        return ready

    def measure(runner: Runner, ready: dict[str, Worker]) -> dict[str, Any]:
        def sample(arm: str, bs: int) -> dict:
            return ready[arm].call("decode", bs=bs, steps=PLAN.steps, warm=PLAN.warm)

        def partial(samples: Samples) -> None:
            write_json(settings.out / f"timing-{runner.value}-partial.json", samples)

        samples = interleave(list(ready), PLAN, runner.value, sample, partial)
        return {
            "samples": {str(bs): per_arm for bs, per_arm in samples.items()},
            "summary": {
                name: {
                    str(bs): summarize(per_arm, STOCK.name, f"{runner.value}-{name}", bs)
                    for bs, per_arm in column(samples, figure).items()
                }
                for name, figure in FIGURES.items()
            },
            "engagement": {arm: w.engagement() for arm, w in ready.items()},
        }

    try:
        # Engines start side by side; the runners are measured one after the
        # other, so that one's host work does not add to the other's spread.
        with ThreadPoolExecutor(max_workers=len(Runner)) as pool:
            ready = dict(zip(Runner, pool.map(started, Runner), strict=True))
        results = {runner.value: measure(runner, ready[runner]) for runner in Runner}
        data = {
            "runners": results,
            "failed": failed,
            "plan": vars(PLAN),
            "gpus": list(settings.gpus),
            "mode": GraphMode.FULL_AND_PIECEWISE.value,
        }
        write_json(settings.out / "timing.json", data)
        data["workers"] = workers
        yield data
    finally:
        close_all(workers)


@pytest.mark.parametrize("bs", Plan.batch_sizes)
@pytest.mark.parametrize("runner", list(Runner), ids=lambda r: r.value)
@pytest.mark.parametrize("arm", [arm.name for arm in ARMS])
def test_decode_step(benchmark, timing, arm: str, runner: Runner, bs: int) -> None:
    if f"{arm}/{runner.value}" in timing["failed"]:
        pytest.fail(timing["failed"][f"{arm}/{runner.value}"], pytrace=False)
    summary = timing["runners"][runner.value]["summary"]
    benchmark.extra_info.update(
        {name: summary[name][str(bs)].get(arm) for name in FIGURES},
        runner=runner.value,
        batch_size=bs,
        arm=arm,
    )
    worker = timing["workers"][arm, runner.value]
    benchmark.pedantic(
        lambda: worker.call("decode", bs=bs, steps=PLAN.steps, warm=PLAN.warm),
        rounds=3,
        iterations=1,
    )
