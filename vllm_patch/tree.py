"""Finding the vLLM to patch, and telling which release it is based on.

A target is a directory holding the `vllm/` package, of one of three kinds:
a git tree (a fork's checkout, or a pristine tree built in the cache from a PyPI
release: sources.py), an installed vLLM (a site-packages directory, the package
beside its `vllm-*.dist-info`), or a plain copy of the source.  Every command
first tells the release the target is based on: from its version string, or from
`--base`.
"""

from __future__ import annotations

import enum
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import releases
from .cache import cache_dir as cache_dir  # precommit.py reads it here
from .gitrepo import GIT_IDENTITY as GIT_IDENTITY  # precommit.py reads it here
from .gitrepo import describe, is_git_worktree
from .releases import Release

_VERSION_ASSIGNMENT = re.compile(
    r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M
)
_DESCRIBE = re.compile(r"^v?(\d+\.\d+\.\d+[^-]*)(?:-(\d+)-g[0-9a-f]+)?$")


class TreeError(Exception):
    """The path cannot be patched as given; the message says why and what to do."""


class NotUtf8Path(TreeError):
    """The tree's path has a byte that is not UTF-8: git's output and every message name
    paths in UTF-8."""


class UnreadableVersion(TreeError):
    """A file that states the tree's version is not UTF-8 text."""


def find_tree(path: Path) -> Path:
    """The vLLM tree at `path`, resolved; refuses anything that holds no `vllm/` package."""
    try:
        root = path.expanduser().resolve()
    except (OSError, RuntimeError) as error:  # RuntimeError: a symlink loop (Python < 3.13)
        raise TreeError(
            f"{path} cannot be resolved ({error}): give a path without a symlink loop"
        ) from None
    try:
        str(root).encode("utf-8")
    except UnicodeEncodeError as error:
        byte = os.fsencode(str(root)[error.start])[0]
        shown = os.fsencode(root).decode("utf-8", "backslashreplace")
        raise NotUtf8Path(
            f"{shown} is not a UTF-8 path (it has the byte \\x{byte:02x}), and sr-prefetch "
            "reads and names only UTF-8 paths: rename it, or the folder above it that has "
            "the byte, to a UTF-8 name"
        ) from None
    if not root.is_dir():
        raise TreeError(f"{path} is not a directory")
    package = root / "vllm"
    if not (package / "__init__.py").is_file() or not (package / "envs.py").is_file():
        hint = " (give the directory that contains it)" if root.name == "vllm" else ""
        raise TreeError(
            f"{root} is not a vLLM tree: it has no vllm/__init__.py and vllm/envs.py{hint}"
        )
    return root


def read_version(root: Path) -> str | None:
    """The vLLM version of the tree at `root`, or None where nothing tells it.

    Read, in order, from `vllm/_version.py` (written by builds and installs,
    kept in the pristine tree), from `git describe` (a fork's checkout has tags
    but no `_version.py`), or from a wheel's `vllm-*.dist-info/METADATA` beside
    the package.  A checkout some commits past a release tag reports that
    release with the count, e.g. `0.33.0+5`.
    """
    version_file = root / "vllm" / "_version.py"
    if version_file.is_file():
        match = _VERSION_ASSIGNMENT.search(_version_text(version_file))
        if match:
            return match.group(1)
    described = describe(root) if is_git_worktree(root) else None
    if described is not None:
        match = _DESCRIBE.match(described.strip())
        if match:
            release, ahead = match.groups()
            return f"{release}+{ahead}" if ahead else release
    for metadata in sorted(root.glob("vllm-*.dist-info/METADATA")):
        for line in _version_text(metadata).splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def _version_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UnreadableVersion(
            f"{path} is not UTF-8 (byte {error.start}), so it tells no vLLM version: "
            "restore it (git checkout, or reinstall vLLM), or name the release with --base"
        ) from None


class Kind(str, enum.Enum):
    """What kind of vLLM a target is; it decides how a patch is kept and taken out."""

    GIT = "git tree"
    INSTALLED = "installed vLLM"
    PLAIN = "source tree without git"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Target:
    """A vLLM to patch: where it is, what kind, and the release it is based on."""

    root: Path
    kind: Kind
    version: str | None
    """As the tree states it (read_version); None where only `--base` names it."""
    release: Release
    note: str | None = None
    """How the release was inferred from the version, where it was not exact."""


def resolve(path: Path, base: str | None = None) -> Target:
    """The target at `path`, its release read from its version or given as `base`."""
    root = find_tree(path)
    try:
        version = read_version(root)
    except UnreadableVersion:
        if base is None:
            raise
        version = None
    if version is None and base is None:
        raise TreeError(
            f"cannot tell the vLLM version of {root}: no vllm/_version.py, no v* git tag, "
            "no vllm-*.dist-info; name the release it is based on with --base RELEASE"
        )
    if is_git_worktree(root):
        kind = Kind.GIT
    elif any(root.glob("vllm-*.dist-info")):
        kind = Kind.INSTALLED
    else:
        kind = Kind.PLAIN
    try:
        if base is not None:
            release, note = releases.get(base), None
            if version is not None and version.split("+")[0] != release.version:
                note = f"vLLM {version}, patched as {release.version} (--base)"
        else:
            assert version is not None
            release, note = releases.base_of(version)
    except releases.UnsupportedRelease as error:
        raise TreeError(f"{root}: {error}") from None
    return Target(root, kind, version, release, note)


def installed_root() -> Path:
    """The site-packages directory of the vLLM this Python imports (found, not imported)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise TreeError(
            "this Python imports no vLLM; install one, or give the directory that holds "
            "the `vllm` package"
        )
    return Path(spec.origin).resolve().parent.parent
