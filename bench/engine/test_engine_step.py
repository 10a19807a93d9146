"""Decode step time of the patched vLLM 0.26.0 engine against stock: pytest-benchmark.

The session (timing.py) starts one engine per (arm, runner) with
FULL_AND_PIECEWISE graphs, the V1 engines on one GPU and the V2 engines on
the other where there are two (SR_ENGINE_GPUS), and takes interleaved rounds
of every arm and batch size, both runners at once.  Its figures (median, 95%
CI, IQR, µs saved against stock and ratio, with paired intervals) go into
each test's `extra_info` and $OUT/engine/timing.json.  What pytest-benchmark
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
from .timing import Plan, interleave, summarize

pytest.importorskip("pytest_benchmark", reason="the bench needs pytest-benchmark")
pytestmark = pytest.mark.gpu

PLAN = Plan(rounds=int(os.environ.get("SR_ENGINE_ROUNDS", Plan.rounds)))


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

    def measure(runner: Runner) -> dict[str, Any]:
        ready = started(runner)

        def sample(arm: str, bs: int) -> float:
            reply = ready[arm].call("decode", bs=bs, steps=PLAN.steps, warm=PLAN.warm)
            return reply["step_s"]

        def partial(samples: dict) -> None:
            write_json(settings.out / f"timing-{runner.value}-partial.json", samples)

        samples = interleave(list(ready), PLAN, runner.value, sample, partial)
        return {
            "samples_s": {str(bs): s for bs, s in samples.items()},
            "summary": {
                str(bs): summarize(s, STOCK.name, runner.value, bs) for bs, s in samples.items()
            },
            "engagement": {arm: w.engagement() for arm, w in ready.items()},
        }

    try:
        with ThreadPoolExecutor(max_workers=len(Runner)) as pool:
            results = dict(zip((r.value for r in Runner), pool.map(measure, Runner), strict=False))
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
    row = timing["runners"][runner.value]["summary"][str(bs)][arm]
    benchmark.extra_info.update(row, runner=runner.value, batch_size=bs, arm=arm)
    worker = timing["workers"][arm, runner.value]
    benchmark.pedantic(
        lambda: worker.call("decode", bs=bs, steps=PLAN.steps, warm=PLAN.warm),
        rounds=3,
        iterations=1,
    )
