"""The vLLM files the patch changes: one module each, listing its operations per design.

Each module finds its sites by structure (see syntax.py) and takes the code that
lands from landing/.  `file_operations` gathers a design's operations for one
release: the forward-context design changes envs.py, ssu_dispatch.py and the Triton
kernels' wrappers and their ReplaySSM call only; the reset design hooks the model
runners as well.  Neither edits a build file: neither adds a compiled op.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..releases import FILES_SINCE, RELEASES, Design, Release, get
from ..syntax import FileOperations, SiteError, Source
from ..tree import TreeError
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


class BaseMismatch(TreeError):
    """The tree has a file or site that the release it is patched as lacks (a wrong
    `--base`): the patch would leave it out, and the tree broken."""


def check_base(root: Path, release: Release) -> None:
    """Refuses (BaseMismatch) to patch the tree at `root` as `release` where the tree
    has what `release` lacks: a file of FILES_SINCE, or the call
    that the patch passes a `rand_seed` only the Triton ReplaySSM wrapper's edit adds."""
    layout = _layout(root)
    problems = [
        f"it has {what}, which vLLM {release.version} lacks (added in {since})"
        for what, since, shown in layout
        if shown and not _since(release, since)
    ]
    calls_wrapper = _file_has(root, mamba_mixer2.PATH, mamba_mixer2.has_call)
    if calls_wrapper and not release.has_file(replayssm_triton.PATH):
        problems.append(
            f"{mamba_mixer2.PATH} calls {replayssm_triton.FUNCTION}, and the patch passes that "
            f"call rand_seed=, which only the edit of {replayssm_triton.PATH} adds (vLLM "
            f"{FILES_SINCE[replayssm_triton.PATH]} on): a TypeError at its first call"
        )
    if not problems:
        return
    fits = [
        r.version
        for r in RELEASES
        if all(_since(r, since) == shown for _, since, shown in layout)
        and (r.has_file(replayssm_triton.PATH) or not calls_wrapper)
    ]
    if fits:
        advice = "name the release it is based on with --base: " + (
            f"{fits[0]} to {fits[-1]} are laid out as it is" if len(fits) > 1 else fits[0]
        )
    else:
        advice = "no supported release is laid out as it is"
    raise BaseMismatch(
        f"{root} is not laid out as vLLM {release.version}, the release it is patched as; "
        "nothing was changed:\n" + "".join(f"  {line}\n" for line in problems) + advice
    )


def _layout(root: Path) -> list[tuple[str, str, bool]]:
    """Each file of FILES_SINCE, the release that added it, and whether the tree at
    `root` has it."""
    return [(path, since, (root / path).is_file()) for path, since in FILES_SINCE.items()]


def _since(release: Release, version: str) -> bool:
    return release.key >= get(version).key


def _file_has(root: Path, path: str, holds: Callable[[Source], bool]) -> bool:
    file = root / path
    if not file.is_file():
        return False
    try:
        return holds(Source(file.read_bytes().decode("utf-8"), path))
    except (SiteError, UnicodeDecodeError):
        return False  # the edits themselves report a file they cannot read
