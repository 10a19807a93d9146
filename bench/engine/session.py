"""What an engine run on the GPU machine needs, read from the environment, and
the worker pool: one worker per (arm, runner), started side by side.


The variables it reads, and every other the harness reads: bench/engine/envs.py.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_patch import tree

from . import model
from .arms import (
    BATCH_SIZES,
    IDENTITY_ARMS,
    NAMED_ONLY_ARMS,
    PLAIN,
    SERVING_BY_NAME,
    SERVINGS,
    STOCK,
    STOCK_AGAIN,
    TIMING_ARMS,
    Arm,
    GraphMode,
    Runner,
    Serving,
)
from .client import CACHE_ROOT, SITES_ENV, Worker, sites_from_env
from .compact import rename
from .envs import (
    ARMS_ENV,
    GPUS_ENV,
    IDENTITY_ARMS_ENV,
    MODES_ENV,
    PROFILE_ENV,
    RUNNERS_ENV,
    SERVING_ENV,
    TP_ENV,
)


@dataclass(frozen=True)
class Settings:
    sites: dict[str, str]
    gpus: tuple[str, ...]
    out: Path
    runners: tuple[Runner, ...] = tuple(Runner)
    timing_arms: tuple[Arm, ...] = TIMING_ARMS
    tp: int = 1

    def __post_init__(self) -> None:
        if len(self.gpus) < self.tp:
            raise ValueError(
                f"{TP_ENV}={self.tp} needs {self.tp} GPUs per engine; {GPUS_ENV} names "
                f"{len(self.gpus)} ({','.join(self.gpus)!r}): name more, or lower {TP_ENV}"
            )

    @classmethod
    def from_env(cls) -> Settings | None:
        sites = sites_from_env()
        if sites is None:
            return None
        gpus = tuple(g for g in os.environ.get(GPUS_ENV, "0").split(",") if g)
        out = Path(os.environ.get("OUT", "/tmp/out")) / "engine"
        runners = runners_from_env(site_vllm_version(sites.get("stock")))
        return cls(sites, gpus, out, runners, timing_arms_from_env(), tp_from_env())

    def gpu(self, runner: Runner) -> str:
        """A runner's engines' GPUs (CUDA_VISIBLE_DEVICES): the GPUs in groups
        of tp, in order, V1 on the first group, V2 on the next (or the same)."""
        groups = len(self.gpus) // self.tp
        first = list(Runner).index(runner) % groups * self.tp
        return ",".join(self.gpus[first : first + self.tp])

    def write_model(self) -> Path:
        """Writes the model directory the workers load (config.json); returns it."""
        return model.write_model_dir(Path("/tmp/sr-engine-model"), self.tp)


V2_RUNS_HYBRID_SINCE = (0, 23, 0)
"""The first vLLM release whose V2 model runner serves hybrid Mamba models; 0.20.0's to
0.22.1's refuse them at engine start ("VLLM_USE_V2_MODEL_RUNNER does not yet support:
hybrid/mamba models")."""


def site_vllm_version(site: str | None) -> str | None:
    """The version of the vLLM pip-installed in the folder `site`, as
    `sr-prefetch` reads it (vllm_patch.tree.read_version); None where none is."""
    return tree.read_version(Path(site)) if site else None


def runners_of(version: str | None) -> tuple[Runner, ...]:
    """The runners that serve the engines' model on vLLM `version`: both, but V1
    alone before V2_RUNS_HYBRID_SINCE; both where the version is not known."""
    release = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    if release and tuple(map(int, release.groups())) < V2_RUNS_HYBRID_SINCE:
        return (Runner.V1,)
    return tuple(Runner)


def runners_from_env(version: str | None = None) -> tuple[Runner, ...]:
    """The runners SR_ENGINE_RUNNERS names; when unset, those vLLM `version` (the
    stock copy's) serves the model with (runners_of)."""
    supported = runners_of(version)
    text = os.environ.get(RUNNERS_ENV, "")
    if not text:
        return supported
    names = [name for name in text.split(",") if name]
    known = {runner.value: runner for runner in Runner}
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ValueError(f"{RUNNERS_ENV} takes v1, v2 or v1,v2; got {text!r}")
    runners = tuple(known[name] for name in names)
    if any(runner not in supported for runner in runners):
        since = ".".join(map(str, V2_RUNS_HYBRID_SINCE))
        raise ValueError(
            f"vLLM {version}'s V2 model runner refuses hybrid Mamba models (served from "
            f"{since} on): set {RUNNERS_ENV}=v1, or leave it unset; got {text!r}"
        )
    return runners


def _names_from_env(env: str, known: set[str], arms: bool = False) -> set[str] | None:
    """The comma-separated names $env gives, each one of `known`; None when unset.
    Arms (`arms`) may also go by the names they had before (compact.RENAMES)."""
    text = os.environ.get(env, "")
    if not text:
        return None
    names = {rename(name) if arms else name for name in text.split(",") if name}
    if names - known or not names:
        raise ValueError(f"{env} takes names among {', '.join(sorted(known))}; got {text!r}")
    return names


def timing_arms_from_env() -> tuple[Arm, ...]:
    """The timing's arms named in SR_ENGINE_ARMS, in TIMING_ARMS' order, then
    NAMED_ONLY_ARMS' (run only where named); stock
    (every saving's base) is measured whether named or not."""
    known = (*TIMING_ARMS, *NAMED_ONLY_ARMS)
    names = _names_from_env(ARMS_ENV, {arm.name for arm in known}, arms=True)
    if names is None:
        return TIMING_ARMS
    return tuple(arm for arm in known if arm.name in names | {STOCK.name})


def identity_arms_from_env() -> tuple[Arm, ...]:
    """The identity run's arms named in SR_ENGINE_IDENTITY_ARMS, in IDENTITY_ARMS'
    order, then NAMED_ONLY_ARMS' (run only where named; the plugin's cells are
    judged by tests/gpu/test_plugin_engine.py); stock and stock-again (the positive
    control) run whether named or not."""
    known = (*IDENTITY_ARMS, *NAMED_ONLY_ARMS)
    names = _names_from_env(IDENTITY_ARMS_ENV, {arm.name for arm in known}, arms=True)
    if names is None:
        return IDENTITY_ARMS
    always = {STOCK.name, STOCK_AGAIN.name}
    return tuple(arm for arm in known if arm.name in names | always)


def modes_from_env(modes: tuple[GraphMode, ...]) -> tuple[GraphMode, ...]:
    """Those of `modes` named in SR_ENGINE_MODES (all when unset), in their order."""
    names = _names_from_env(MODES_ENV, {mode.value for mode in modes})
    if names is None:
        return modes
    return tuple(mode for mode in modes if mode.value in names)


def servings_from_env() -> tuple[Serving, ...]:
    """The serving configurations SR_ENGINE_SERVING names, in SERVINGS' order;
    PLAIN alone when unset."""
    names = _names_from_env(SERVING_ENV, set(SERVING_BY_NAME))
    if names is None:
        return (PLAIN,)
    return tuple(serving for serving in SERVINGS if serving.name in names)


def tp_from_env() -> int:
    """The tensor-parallel size SR_ENGINE_TP names, 1 when unset."""
    value = os.environ.get(TP_ENV, "").strip()
    if not value:
        return 1
    if not value.isdigit() or int(value) not in model.TP_SIZES:
        sizes = ", ".join(map(str, model.TP_SIZES))
        raise ValueError(f"{TP_ENV} takes a tensor-parallel size among {sizes}; got {value!r}")
    return int(value)


def profile_batch_sizes_from_env() -> tuple[int, ...]:
    """The batch sizes SR_ENGINE_PROFILE names ("1,8"), none when unset."""
    value = os.environ.get(PROFILE_ENV, "").strip()
    if not value:
        return ()
    try:
        sizes = tuple(int(part) for part in value.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(size not in BATCH_SIZES for size in sizes):
        raise ValueError(
            f"{PROFILE_ENV} takes timed batch sizes among {BATCH_SIZES}, comma-separated "
            f"(e.g. 1,8); got {value!r}"
        )
    return sizes


SKIP_REASON = (
    f"needs the staged vLLM copies named in ${SITES_ENV} "
    "(tests/gpu/vllm/engine.sh sets it on the GPU machine)"
)


def spawn_all(
    pairs: list[tuple[Arm, Runner]],
    settings: Settings,
    tag: str,
    extra_env: dict[str, str] | None = None,
) -> dict[tuple[str, str], Worker | Exception]:
    """A worker per (arm, runner), started in parallel; a failure is kept, not raised."""
    model_dir = settings.write_model()

    def spawn(pair: tuple[Arm, Runner]) -> Worker | Exception:
        arm, runner = pair
        try:
            return Worker.spawn(
                arm,
                runner,
                sites=settings.sites,
                model_dir=model_dir,
                gpu=settings.gpu(runner),
                tp=settings.tp,
                log_dir=settings.out / tag / "logs",
                cache_root=CACHE_ROOT,
                extra_env=extra_env,
            )
        except Exception as error:
            return error

    if not pairs:
        return {}  # a resumed identity run with every cell recorded
    with ThreadPoolExecutor(max_workers=len(pairs)) as pool:
        spawned = list(pool.map(spawn, pairs))
    return {(arm.name, runner.value): w for (arm, runner), w in zip(pairs, spawned, strict=False)}


def close_all(workers: dict[Any, Worker | Exception]) -> None:
    """Closes every worker that spawned (spawn_all keeps a failure as its
    exception), side by side: each waits for its engine to stop."""
    spawned = [worker for worker in workers.values() if not isinstance(worker, Exception)]
    with ThreadPoolExecutor(max_workers=max(1, len(spawned))) as pool:
        list(pool.map(lambda worker: worker.close(), spawned))


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_suffix(".part")
    staged.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    staged.replace(path)
