"""`sr-prefetch build-op`: the seed op's library, for a vLLM that has no build step.

A source tree builds the op with its own CMake (the `_mamba_sr_C` target the reset
design adds, targets/cmake_lists.py).  An installed vLLM (or a tree built with
VLLM_USE_PRECOMPILED, whose libraries come from upstream's wheel) has none, so
build-op compiles runner_hooks' copy of the source, the bytes a source tree gets as
csrc/mamba/stock_seeds.cu, with torch.utils.cpp_extension (runner_hooks.core.
seed_kernel.build_library, its build flags) under the extension's own name: its
TORCH_EXTENSION_NAME, the op's torch.ops namespace, and its PyInit__mamba_sr_C are
then vLLM's.  The library is built in sr-prefetch's cache and placed in the target
as vllm/_mamba_sr_C.so (patch.BUILT_OP) in one journaled write (written beside it,
renamed over it), so that `import vllm._mamba_sr_C` loads it; `revert` removes it.
For the plugin (plugin.py), `--plugin` places it in the cache instead, where the
plugin finds it (cache.plugin_op_path: one per torch version).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from . import cache, journal, patch, tree
from .releases import Design
from .targets.cmake_lists import EXTENSION


def check_target(target: tree.Target) -> None:
    """Refuses (PatchError) a target without the reset design applied whole and current:
    the library is the op that design's code calls."""
    report = patch.status(target)
    if report.problem is not None:
        raise patch.PatchError(report.problem)
    if report.design is None:
        raise patch.PatchError(
            f"no sr-prefetch design is applied to {target.root}, so it has no seed op; "
            f"apply one first: sr-prefetch apply {shlex.quote(str(target.root))}"
        )
    if report.design is not Design.RESET:
        raise patch.PatchError(
            f"the {report.design.value} design applied to {target.root} has no seed op "
            "(it draws with randint); only the reset design builds one"
        )
    stale = [r for r in report.files if r.state in ("stale", "unknown")]
    if stale:
        raise patch.PatchError(
            f"the patch in {target.root} is not what this sr-prefetch applies:\n"
            + "\n".join("\n".join(r.lines()) for r in stale)
        )


def build_directory(seed_kernel: ModuleType, capabilities: Sequence[tuple[int, int]]) -> Path:
    """Where the library is built: one directory per source, torch and architectures
    (seed_kernel.build_name), in sr-prefetch's cache, so a build is reused as it stands."""
    return tree.cache_dir() / "build-op" / seed_kernel.build_name(capabilities)


def _library(capabilities: Sequence[tuple[int, int]], seed_kernel: ModuleType) -> Path:
    """The library, built in the cache (seed_kernel.SeedKernelUnavailable where it
    cannot be)."""
    directory = build_directory(seed_kernel, capabilities)
    directory.mkdir(parents=True, exist_ok=True)
    library = seed_kernel.build_library(capabilities, name=EXTENSION, build_directory=directory)
    if library.name != f"{EXTENSION}.so":
        # torch names a second build of one name in a process `<name>_v1`, and its op's
        # namespace with it; vllm._mamba_sr_C would not find it.
        raise patch.PatchError(f"the build made {library.name}, not {EXTENSION}.so")
    return library


def build(
    target: tree.Target, capabilities: Sequence[tuple[int, int]], seed_kernel: ModuleType
) -> tuple[Path, Path]:
    """Builds the library (seed_kernel.SeedKernelUnavailable where it cannot) and places
    it in `target`; returns where it was built and where it was placed."""
    library = _library(capabilities, seed_kernel)
    journal.replace_files(
        target.root, {patch.BUILT_OP: library.read_bytes()}, what="placing of the seed op"
    )
    return library, target.root / patch.BUILT_OP


def build_for_plugin(
    capabilities: Sequence[tuple[int, int]], seed_kernel: ModuleType, placed: Path
) -> Path:
    """Builds the library and places it at `placed` (plugin.op_path: the plugin serves
    it as vllm._mamba_sr_C), written beside it and renamed over it, so that an engine
    finds the old library or the new one whole; returns where it was built."""
    library = _library(capabilities, seed_kernel)
    with cache.writing():
        placed.parent.mkdir(parents=True, exist_ok=True)
        staged = placed.with_name(f"{placed.name}.part")
        with staged.open("wb") as file:
            file.write(library.read_bytes())
            file.flush()
            os.fsync(file.fileno())
        os.replace(staged, placed)
    return library
