"""The Triton autotuning picks an engine made, and where engines' picks differ.

The Mamba-2 SSD prefill kernels are @triton.autotune'd, and mamba_mixer2 warms
them up in the profile run of every start.  vLLM keeps the picks on disk in
Triton's cache (env_override.py sets TRITON_CACHE_AUTOTUNING=1), which every
engine of a run shares (TRITON_CACHE_DIR; vLLM 0.26 moves it into each compile
cache only with VLLM_USE_STANDALONE_COMPILE=0).  An engine that finds a pick
there reads it; engines that start side by side before there is one each pick
by timing, under each other's load.  So timing.run starts its first engine
alone, and asks every engine for its picks.

Inductor's kernels are compiled per arm (each arm's VLLM_CACHE_ROOT holds its
compile cache, which the arm's later engines load); arms.compilation_config keeps
their configurations from being picked by timing.  `inductor_picks` reports them
beside the Mamba kernels', so a run shows whether every engine ran the same ones.
"""

from __future__ import annotations

import gc
import hashlib
import sys
from collections.abc import Iterable
from typing import Any

PICKED_MODULES = "vllm.model_executor.layers.mamba."
"""Where the autotuned kernels whose picks an engine reports live."""


def picks(modules: dict[str, Any] | None = None) -> dict[str, dict[str, str]]:
    """Per autotuned kernel of vLLM's Mamba layers (module.name), its picks so far:
    the configuration chosen for each tuning key, as Triton prints them."""
    from triton.runtime.autotuner import Autotuner

    found: dict[str, dict[str, str]] = {}
    loaded = sys.modules if modules is None else modules
    for module_name, module in sorted(loaded.items()):
        if not module_name.startswith(PICKED_MODULES) or module is None:
            continue
        for name, value in sorted(vars(module).items()):
            if isinstance(value, Autotuner) and value.cache:
                short = module_name.rsplit(".", 1)[-1]
                found[f"{short}.{name}"] = {
                    str(key): str(config) for key, config in sorted(value.cache.items(), key=str)
                }
    return found


INDUCTOR = "inductor."
"""The prefix of Inductor's kernels among an engine's picks."""


def inductor_picks(objects: Iterable[Any] | None = None) -> dict[str, dict[str, str]]:
    """Per Triton kernel Inductor compiled in this process (inductor.name@the first 8 hex
    of its source's sha256), the configuration it launches with, under the key "config":
    its one launcher's, autotuned or the only one (kernels not yet run, with several
    launchers left, are left out).  `objects`: where to look (default: every object the
    garbage collector tracks)."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    found: dict[str, dict[str, str]] = {}
    for kernel in gc.get_objects() if objects is None else objects:
        if not isinstance(kernel, CachingAutotuner) or len(kernel.launchers) != 1:
            continue
        fn = getattr(kernel, "fn", None)
        source = getattr(fn, "src", "") or ""
        digest = hashlib.sha256(source.encode()).hexdigest()[:8]
        name = f"{INDUCTOR}{getattr(fn, '__name__', '?')}@{digest}"
        found[name] = {"config": str(kernel.launchers[0].config)}
    return dict(sorted(found.items()))


def pick_name(kernel: str, key: str) -> str:
    """How a kernel's pick for one tuning key is named: kernel[key]."""
    return f"{kernel}[{key}]"


def differences(by_engine: dict[str, dict[str, dict[str, str]]]) -> dict[str, dict[str, str]]:
    """The kernels (and tuning keys) whose pick is not the same in every engine given:
    pick_name -> {engine: its pick}; empty where all agree.  An engine that has no
    pick for a key counts as picking nothing ("-")."""
    keys = {
        (kernel, key)
        for picked in by_engine.values()
        for kernel, per_key in picked.items()
        for key in per_key
    }
    out: dict[str, dict[str, str]] = {}
    for kernel, key in sorted(keys):
        seen = {
            engine: picked.get(kernel, {}).get(key, "-") for engine, picked in by_engine.items()
        }
        if len(set(seen.values())) > 1:
            out[pick_name(kernel, key)] = seen
    return out
