"""The vLLM files the patch changes: one module each, listing its operations per design.

Each module finds its sites by structure (see syntax.py) and takes the code that
lands from landing/.  `file_operations` gathers a design's operations for one
release: the reset design hooks the model runners; the forward-context design
changes envs.py, ssu_dispatch.py and mamba_ssm.py only.
"""

from __future__ import annotations

from ..releases import Design, Release
from ..syntax import FileOperations
from . import envs, mamba_ssm, ssu_dispatch, v1_runner, v2_cudagraph, v2_runner

PATHS: tuple[str, ...] = (
    envs.PATH,
    ssu_dispatch.PATH,
    mamba_ssm.PATH,
    v1_runner.PATH,
    v2_runner.PATH,
    v2_cudagraph.PATH,
)
"""Every file either design changes, as paths from the tree's root."""


def file_operations(design: Design, release: Release) -> tuple[FileOperations, ...]:
    """The operations of `design` on `release`'s files, file by file."""
    files = [
        envs.operations(design),
        ssu_dispatch.operations(design),
        mamba_ssm.operations(design),
    ]
    if design is Design.RESET:
        files += [
            v1_runner.operations(release),
            v2_runner.operations(release),
            v2_cudagraph.operations(release),
        ]
    return tuple(files)
