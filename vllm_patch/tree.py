"""Finding a vLLM tree, telling its version, and the pristine v0.33.0 tree in the cache.

A vLLM tree is a directory holding the `vllm/` package: a fork's checkout, or
the pristine tree this module builds from the PyPI release.  The patch is
written against one release, so every command first checks the version.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SUPPORTED_VERSION = "0.33.0"
"""The vLLM release whose source the anchored edits are written against."""

PRISTINE_COMMIT_MESSAGE = f"vLLM v{SUPPORTED_VERSION}"
_ELF_MAGIC = b"\x7fELF"
_VERSION_ASSIGNMENT = re.compile(
    r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M
)
_DESCRIBE = re.compile(r"^v?(\d+\.\d+\.\d+[^-]*)(?:-(\d+)-g[0-9a-f]+)?$")


class TreeError(Exception):
    """The path cannot be patched as given; the message says why and what to do."""


def find_tree(path: Path) -> Path:
    """The vLLM tree at `path`, resolved; refuses anything that holds no `vllm/` package."""
    root = path.expanduser().resolve()
    if not root.is_dir():
        raise TreeError(f"{path} is not a directory")
    package = root / "vllm"
    if not (package / "__init__.py").is_file() or not (package / "envs.py").is_file():
        hint = " (give the directory that contains it)" if root.name == "vllm" else ""
        raise TreeError(
            f"{root} is not a vLLM tree: it has no vllm/__init__.py and vllm/envs.py{hint}"
        )
    return root


def read_version(root: Path) -> str:
    """The vLLM version of the tree at `root`.

    Read, in order, from `vllm/_version.py` (written by builds and installs,
    kept in the pristine tree), from `git describe` (a fork's checkout has tags
    but no `_version.py`), or from a wheel's `vllm-*.dist-info/METADATA` beside
    the package.  A checkout some commits past a release tag reports that
    release with the count, e.g. `0.33.0+5`.
    """
    version_file = root / "vllm" / "_version.py"
    if version_file.is_file():
        match = _VERSION_ASSIGNMENT.search(version_file.read_text(encoding="utf-8"))
        if match:
            return match.group(1)
    described = (
        _git(root, "describe", "--tags", "--match", "v*", check=False)
        if is_git_worktree(root)
        else None
    )
    if described is not None:
        match = _DESCRIBE.match(described.strip())
        if match:
            release, ahead = match.groups()
            return f"{release}+{ahead}" if ahead else release
    for metadata in sorted(root.glob("vllm-*.dist-info/METADATA")):
        for line in metadata.read_text(encoding="utf-8").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    raise TreeError(
        f"cannot tell the vLLM version of {root}: no vllm/_version.py, no v* git tag, "
        "no vllm-*.dist-info"
    )


def check_version(root: Path) -> str:
    """The tree's version, or TreeError naming the version found and the one supported."""
    version = read_version(root)
    if version.split("+", 1)[0] != SUPPORTED_VERSION:
        raise TreeError(
            f"{root} is vLLM {version}; sr-prefetch supports vLLM {SUPPORTED_VERSION} only "
            f"(check out the v{SUPPORTED_VERSION} tag, or a branch based on it)"
        )
    return version


def is_git_worktree(root: Path) -> bool:
    """Whether `root` is the top of a git work tree (not merely inside one)."""
    top = _git(root, "rev-parse", "--show-toplevel", check=False)
    return top is not None and Path(top.strip()).resolve() == root


def dirty_paths(root: Path, relpaths: list[str]) -> list[str]:
    """Those of `relpaths` that differ from HEAD or are untracked, in a git work tree."""
    out = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *relpaths)
    return sorted({line[3:].strip() for line in (out or "").splitlines() if line.strip()})


def cache_dir() -> Path:
    """Where the wheel and the pristine tree live: $SR_PREFETCH_CACHE or ~/.cache/sr-prefetch."""
    configured = os.environ.get("SR_PREFETCH_CACHE")
    base = Path(configured) if configured else Path.home() / ".cache" / "sr-prefetch"
    return base.expanduser()


def wheel_dir() -> Path:
    """Where the vLLM wheel is downloaded to; CI may fill it first to install from it too."""
    return cache_dir() / "wheels"


def pristine_tree() -> Path:
    """The pristine vLLM v0.33.0 tree as a git repository in the cache, built once.

    Built from the PyPI wheel (downloaded once into `wheel_dir()`): its `vllm/`
    package, less compiled binaries, which a fork's source tree does not track,
    committed as "vLLM v0.33.0" and tagged v0.33.0.  The commit stays pristine:
    the commands change only the work tree, so `HEAD` is always the base to
    diff and export against.
    """
    target = cache_dir() / f"vllm-{SUPPORTED_VERSION}"
    if (target / ".git").is_dir():
        return target
    wheel = _wheel()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
    try:
        _unpack_sources(wheel, staging)
        _git(staging, "init", "--quiet")
        _git(staging, "add", "--all")
        _commit(staging, PRISTINE_COMMIT_MESSAGE)
        _git(staging, "tag", f"v{SUPPORTED_VERSION}")
        try:
            staging.rename(target)
        except OSError:
            if not (target / ".git").is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def clone(source: Path, destination: Path) -> Path:
    """A fresh work tree of `source`'s HEAD at `destination` (cheap: local objects are linked)."""
    _git(source.parent, "clone", "--quiet", str(source), str(destination))
    return destination


def commit_all(root: Path, message: str) -> None:
    """Commits every change in the work tree at `root` with `message`."""
    _git(root, "add", "--all")
    _commit(root, message)


def format_patch(root: Path) -> str:
    """HEAD of `root` as a `git am`-able mail."""
    return _git(root, "format-patch", "-1", "--stdout", "HEAD") or ""


def _wheel() -> Path:
    pattern = f"vllm-{SUPPORTED_VERSION}-*.whl"
    found = sorted(wheel_dir().glob(pattern))
    if not found:
        wheel_dir().mkdir(parents=True, exist_ok=True)
        print(f"Downloading vLLM {SUPPORTED_VERSION} from PyPI into {wheel_dir()} (once) ...")
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            f"vllm=={SUPPORTED_VERSION}",
            "--dest",
            str(wheel_dir()),
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        found = sorted(wheel_dir().glob(pattern))
        if result.returncode != 0 or not found:
            raise TreeError(
                f"could not download vLLM {SUPPORTED_VERSION}: {' '.join(command)} exited "
                f"{result.returncode}:\n{result.stderr.strip()[-2000:]}"
            )
    return found[0]


def _unpack_sources(wheel: Path, destination: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if info.is_dir() or not info.filename.startswith("vllm/"):
                continue
            with archive.open(info) as member:
                if member.read(len(_ELF_MAGIC)) == _ELF_MAGIC:
                    continue
            archive.extract(info, destination)


def _commit(root: Path, message: str) -> None:
    _git(
        root,
        "-c",
        "user.name=sr-prefetch",
        "-c",
        "user.email=sr-prefetch@localhost",
        "-c",
        "commit.gpgsign=false",
        "commit",
        "--quiet",
        "--no-verify",
        "--message",
        message,
    )


def _git(root: Path, *args: str, check: bool = True) -> str | None:
    """git's stdout, or None (with check=False) when it fails or is missing."""
    try:
        result = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        if check:
            raise TreeError("git is not installed; sr-prefetch needs it") from None
        return None
    if result.returncode != 0:
        if check:
            raise TreeError(f"git {' '.join(args)} failed in {root}: {result.stderr.strip()}")
        return None
    return result.stdout
