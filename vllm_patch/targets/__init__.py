"""The vLLM files the patch changes: one module each, listing its operations per design.

Each module finds its sites by structure (see syntax.py) and takes the code that
lands from landing/.  `file_operations` gathers a design's operations for one
release: the reset design hooks the model runners; the forward-context design
changes envs.py, ssu_dispatch.py and the Triton kernels' wrappers and their
ReplaySSM call only.
"""

from __future__ import annotations

from ..releases import Design, Release
from ..syntax import FileOperations
from . import (
    envs,
    mamba_mixer2,
    mamba_ssm,
    replayssm_triton,
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
)
"""Every file either design changes in some release, as paths from the tree's root."""


def paths(release: Release) -> tuple[str, ...]:
    """The files of PATHS that `release` has (releases.FILES_SINCE)."""
    return tuple(path for path in PATHS if release.has_file(path))


def file_operations(design: Design, release: Release) -> tuple[FileOperations, ...]:
    """The operations of `design` on `release`'s files, file by file."""
    files = [
        envs.operations(design),
        ssu_dispatch.operations(design),
        mamba_ssm.operations(design),
    ]
    if release.has_file(replayssm_triton.PATH):
        # mamba_mixer2.py's call of the Triton ReplaySSM came with its wrapper.
        files += [mamba_mixer2.operations(design), replayssm_triton.operations(design)]
    if design is Design.RESET:
        files += [
            v1_runner.operations(release),
            v2_runner.operations(release),
            v2_cudagraph.operations(release),
        ]
    return tuple(files)
