"""The identity check's run: every (arm, runner) engine through every serving
configuration and graph mode.

`run(settings)` starts one worker per (arm, runner) (session.py; the runners
of $SR_ENGINE_RUNNERS, by default those the stock copy's vLLM serves the model
with: session.runners_of), each going through the servings of
$SR_ENGINE_SERVING (arms.SERVINGS; plain when unset) and, in each, the MODES of
$SR_ENGINE_MODES, and returns every cell's record (each TP rank's state in it:
worker.py's identity).  Stock leads every cell:
its V1 engine of a (serving, mode) starts alone, then stock's V2 engine, then
every other arm's (`_leaders`).  Used by tests/gpu/vllm/test_engine_identity.py,
which asserts on the records.
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
from .arms import IDENTITY_ENV, PLAIN, STOCK, Arm, GraphMode, Runner, Serving
from .envs import RESUME_ENV
from .session import (
    Settings,
    close_all,
    identity_arms_from_env,
    modes_from_env,
    servings_from_env,
    site_vllm_version,
    spawn_all,
    write_json,
)


def key(arm: str, runner: Runner, mode: GraphMode, serving: Serving = PLAIN) -> str:
    """A cell's name: arm/runner/mode, and /serving for all but PLAIN (whose
    records of runs before the servings have the same names)."""
    cell = f"{arm}/{runner.value}/{mode.value}"
    return cell if serving == PLAIN else f"{cell}/{serving.name}"


MODES = (
    GraphMode.EAGER,
    GraphMode.FULL_AND_PIECEWISE,
    GraphMode.PIECEWISE,
    GraphMode.FULL_DECODE_ONLY,
)


def _leaders(arm: Arm, runner: Runner) -> list[Runner]:
    """Whose stock engine of a (serving, mode) must have run before this arm's starts.

    Kernels picked by timing differ from engine to engine when engines pick
    side by side; an engine that starts after the picks are in the shared
    Triton cache reads them instead: the Mamba-2 SSD prefill kernels are
    @triton.autotune'd (vLLM sets TRITON_CACHE_AUTOTUNING=1).  So stock V1
    leads every cell, and stock V2 too for the V2 arms (kernels only the V2
    runner runs).  Inductor's picks are each engine's own (its cache under
    the engine's VLLM_CACHE_ROOT): arms.compilation_config keeps Inductor
    from picking by timing."""
    if arm is STOCK:
        return [] if runner is Runner.V1 else [Runner.V1]
    return [Runner.V1] if runner is Runner.V1 else [Runner.V1, runner]


def _resumed() -> dict[str, Any]:
    path = os.environ.get(RESUME_ENV)
    if not path or not Path(path).is_file():
        return {"records": {}, "engagement": {}}
    data = json.loads(Path(path).read_text())
    return {
        "records": {cell: r for cell, r in data["records"].items() if "error" not in r},
        "engagement": data.get("engagement", {}),
    }


Cell = tuple[Serving, GraphMode]


def _run_worker(
    worker: Any,
    cells: list[Cell],
    respawn: Any,
    keep: Any,
    before: Callable[[Cell], None],
) -> None:
    """Each (serving, mode) cell's record from one worker, to `keep(cell, record,
    lines)` as it comes, with the worker's engagement lines so far (kept with
    the records, so that a run cut off by a call's time limit has them when it
    resumes), respawning the worker once after a failure.  `before(cell)`
    returns when the worker's engine of that cell may start."""
    for cell in cells:
        serving, mode = cell
        before(cell)
        for attempt in (1, 2):
            try:
                if isinstance(worker, Exception):
                    raise worker
                started = worker.call("start", mode=mode.value, serving=serving.name)
                record = worker.call("identity")
                record["start_s"] = started["start_s"]
                break
            except Exception as error:
                record = {"error": f"{type(error).__name__}: {error}", "attempt": attempt}
                if not isinstance(worker, Exception):
                    worker.close()
                worker = respawn()
        keep(cell, record, None if isinstance(worker, Exception) else worker.engagement())
    if not isinstance(worker, Exception):
        worker.close()


def run(
    settings: Settings,
    spawn: Callable[..., dict] = spawn_all,
    arms: tuple[Arm, ...] | None = None,
    modes: tuple[GraphMode, ...] = MODES,
) -> dict[str, Any]:
    """Every cell's record (and each worker's engagement lines), saved as they come
    to settings.out / "identity.json" and to $SR_ENGINE_RESUME where it is set.  The
    arms are `arms` (stock first), else those of $SR_ENGINE_IDENTITY_ARMS; the modes
    those of `modes` that $SR_ENGINE_MODES names."""
    previous = _resumed()
    records: dict[str, Any] = dict(previous["records"])
    engagement: dict[str, list[str]] = dict(previous["engagement"])
    arms = identity_arms_from_env() if arms is None else arms
    modes, servings = modes_from_env(modes), servings_from_env()
    cells = [(serving, mode) for serving in servings for mode in modes]
    todo = {
        (arm.name, runner): [c for c in cells if key(arm.name, runner, c[1], c[0]) not in records]
        for runner in settings.runners
        for arm in arms
    }
    pairs = [(arm, runner) for runner in settings.runners for arm in arms if todo[arm.name, runner]]
    workers = spawn(pairs, settings, "identity", IDENTITY_ENV)
    # Set once stock's engine of (runner, serving, mode) has given its record (or
    # failed); from the start for a runner not run (SR_ENGINE_RUNNERS).
    led = {(runner, cell): threading.Event() for runner in Runner for cell in cells}
    for (runner, (serving, mode)), event in led.items():
        if runner not in settings.runners or key(STOCK.name, runner, mode, serving) in records:
            event.set()
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
            return spawn([pair], settings, "identity", IDENTITY_ENV)[arm.name, runner.value]

        def keep(cell: Cell, got: dict, lines: list[str] | None) -> None:
            serving, mode = cell
            with lock:
                records[key(arm.name, runner, mode, serving)] = got
                if lines is not None:
                    engagement[f"{arm.name}/{runner.value}"] = lines
                save()
            if arm is STOCK:
                led[runner, cell].set()

        def before(cell: Cell) -> None:
            for leader in _leaders(arm, runner):
                led[leader, cell].wait()

        _run_worker(workers[arm.name, runner.value], todo[arm.name, runner], respawn, keep, before)

    try:
        with ThreadPoolExecutor(max_workers=max(1, len(pairs))) as pool:
            list(pool.map(run_pair, pairs))
    finally:
        close_all(workers)
    meta = {
        "vllm": site_vllm_version(settings.sites.get("stock")),
        "model": model.model_config(settings.tp),
        "model_source": model.SOURCE,
        "gpus": list(settings.gpus),
        "tp": settings.tp,
    }
    save(**meta)
    return {"records": records, "engagement": engagement, **meta}
