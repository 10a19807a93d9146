"""The identity check's run: every (arm, runner) engine through every graph mode.

`run(settings)` starts one worker per (arm, runner) (session.py), lets the
first (stock, V1, eager) start its engine alone, then runs the rest side by
side, each worker through MODES, and returns every cell's record.  Used by
tests/gpu/vllm/test_engine_identity.py, which asserts on the records.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import model
from .arms import DETERMINISTIC_ENV, IDENTITY_ARMS, STOCK, Arm, GraphMode, Runner
from .session import Settings, close_all, spawn_all, write_json


def key(arm: str, runner: Runner, mode: GraphMode) -> str:
    return f"{arm}/{runner.value}/{mode.value}"


# Eager first: the first engine to prefill picks the SSD kernels' autotuned
# configs, which every other engine then reads from the Triton cache.
MODES = (GraphMode.EAGER, GraphMode.FULL_AND_PIECEWISE, GraphMode.PIECEWISE)


# A JSON file of records from an earlier run of the same code on this machine
# (tests/gpu/vllm/engine.sh keeps one in /tmp): cells recorded there without
# error are not run again, so a run cut off by a device call's time limit
# goes on where it stopped.
RESUME_ENV = "SR_ENGINE_RESUME"


def _resumed() -> dict[str, Any]:
    path = os.environ.get(RESUME_ENV)
    if not path or not Path(path).is_file():
        return {"records": {}, "engagement": {}}
    data = json.loads(Path(path).read_text())
    return {
        "records": {cell: r for cell, r in data["records"].items() if "error" not in r},
        "engagement": data.get("engagement", {}),
    }


def _run_worker(
    worker: Any,
    modes: list[GraphMode],
    respawn: Any,
    keep: Any,
    after: threading.Event | None,
) -> list[str]:
    """Each mode's record from one worker, to `keep(mode, record)` as it comes,
    respawning the worker once after a failure; returns its engagement lines.
    Its first engine starts once `after` is set."""
    lines: list[str] = []
    if after is not None:
        after.wait()
    for mode in modes:
        for attempt in (1, 2):
            try:
                if isinstance(worker, Exception):
                    raise worker
                started = worker.call("start", mode=mode.value)
                record = worker.call("identity")
                record["start_s"] = started["start_s"]
                break
            except Exception as error:
                record = {"error": f"{type(error).__name__}: {error}", "attempt": attempt}
                if not isinstance(worker, Exception):
                    worker.close()
                worker = respawn()
        keep(mode, record)
    if not isinstance(worker, Exception):
        lines = worker.engagement()
        worker.close()
    return lines


def run(settings: Settings, spawn: Callable[..., dict] = spawn_all) -> dict[str, Any]:
    """Every cell's record (and each worker's engagement lines), saved as they come
    to settings.out / "identity.json" and to $SR_ENGINE_RESUME where it is set."""
    previous = _resumed()
    records: dict[str, Any] = dict(previous["records"])
    engagement: dict[str, list[str]] = dict(previous["engagement"])
    todo = {
        (arm.name, runner): [mode for mode in MODES if key(arm.name, runner, mode) not in records]
        for runner in Runner
        for arm in IDENTITY_ARMS
    }
    pairs = [(arm, runner) for runner in Runner for arm in IDENTITY_ARMS if todo[arm.name, runner]]
    workers = spawn(pairs, settings, "identity", DETERMINISTIC_ENV)
    first = (STOCK, Runner.V1)
    picked = threading.Event()
    if key(STOCK.name, Runner.V1, MODES[0]) in records:
        picked.set()
    lock = threading.Lock()
    paths = [settings.out / "identity.json"]
    if os.environ.get(RESUME_ENV):
        paths.append(Path(os.environ[RESUME_ENV]))

    def save(**extra: Any) -> None:
        for path in paths:
            write_json(path, {"records": records, "engagement": engagement, **extra})

    def run_pair(pair: tuple[Arm, Runner]) -> None:
        arm, runner = pair

        def respawn() -> Any:
            return spawn([pair], settings, "identity", DETERMINISTIC_ENV)[arm.name, runner.value]

        def keep(mode: GraphMode, got: dict) -> None:
            with lock:
                records[key(arm.name, runner, mode)] = got
                save()
            picked.set()

        after = None if pair == first else picked
        worker = workers[arm.name, runner.value]
        lines = _run_worker(worker, todo[arm.name, runner], respawn, keep, after)
        with lock:
            engagement[f"{arm.name}/{runner.value}"] = lines

    try:
        with ThreadPoolExecutor(max_workers=max(1, len(pairs))) as pool:
            list(pool.map(run_pair, pairs))
    finally:
        close_all(workers)
    meta = {
        "model": model.rank_config(),
        "model_source": model.SOURCE,
        "gpus": list(settings.gpus),
    }
    save(**meta)
    return {"records": records, "engagement": engagement, **meta}
