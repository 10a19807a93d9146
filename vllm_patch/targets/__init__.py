"""The vLLM files the patch changes: one module each, listing its operations per design.

Each module finds its sites by structure (see syntax.py) and takes the code that
lands from landing/.  `file_operations` gathers a design's operations for one
release: the reset design hooks the model runners; the forward-context design
changes envs.py, ssu_dispatch.py and the Triton kernels' wrappers and their
ReplaySSM call only.  Where the tree has setup.py (a source tree) and the vendored
package has CUDA sources, setup.py lists them as package data.
"""

from __future__ import annotations

from .. import vendor
from ..releases import Design, Release
from ..syntax import FileOperations
from . import (
    envs,
    mamba_mixer2,
    mamba_ssm,
    replayssm_triton,
    setup_py,
    ssu_dispatch,
    v1_runner,
    v2_cudagraph,
    v2_runner,
)

PATHS: tuple[str, ...] = (
    envs.PATH,
    ssu_dispatch.PATH,
    mamba_ssm.PATH,
    replayssm_triton.PATH,
    mamba_mixer2.PATH,
    v1_runner.PATH,
    v2_runner.PATH,
    v2_cudagraph.PATH,
    setup_py.PATH,
)
"""Every file either design changes in some release, as paths from the tree's root."""


def paths(release: Release) -> tuple[str, ...]:
    """The files of PATHS that `release` has (releases.FILES_SINCE)."""
    return tuple(path for path in PATHS if release.has_file(path))


def file_operations(
    design: Design, release: Release, *, setup_py_present: bool
) -> tuple[FileOperations, ...]:
    """The operations of `design` on `release`'s files, file by file; setup.py's where
    the tree has one (`setup_py_present`)."""
    files = [
        envs.operations(design),
        ssu_dispatch.operations(design),
        mamba_ssm.operations(design),
        mamba_mixer2.operations(design),
    ]
    if release.has_file(replayssm_triton.PATH):
        files.append(replayssm_triton.operations(design))
    if design is Design.RESET:
        files += [
            v1_runner.operations(release),
            v2_runner.operations(release),
            v2_cudagraph.operations(release),
        ]
    if setup_py_present and setup_py.needed(vendor.vendored_files()):
        files.append(setup_py.operations())
    return tuple(files)
