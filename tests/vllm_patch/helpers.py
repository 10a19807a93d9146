"""Helpers shared by the sr-prefetch tests."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_patch import cli, releases, targets


def tree_files(release: releases.Release) -> tuple[str, ...]:
    """What sr-prefetch reads of `release`'s tree: the package marker, the version, the
    files it changes there."""
    return ("vllm/__init__.py", "vllm/_version.py", *targets.paths(release))


TREE_FILES = tree_files(releases.NEWEST)
"""tree_files of the newest release, which has every file the patch changes."""


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=True
    ).stdout


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` (but .git) -> sha256: equal snapshots, equal trees."""
    return {
        path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and ".git" not in path.relative_to(root).parts
    }


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    """sr-prefetch's exit status and everything it printed."""
    status = cli.main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def commit(root: Path, message: str) -> None:
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", message)


def small_copy(pristine: Path, root: Path) -> Path:
    """The files of `pristine` that sr-prefetch reads or changes, copied to `root`."""
    for path in TREE_FILES:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes((pristine / path).read_bytes())
    return root


def small_git_copy(pristine: Path, root: Path, release: releases.Release = releases.NEWEST) -> Path:
    """small_copy, committed and tagged as a pristine tree of `release` is."""
    small_copy(pristine, root)
    git(root, "init", "-q")
    git(root, "add", "--all")
    commit(root, f"vLLM v{release.version}")
    git(root, "tag", f"v{release.version}")
    return root


def full_snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under `root` (but a top-level .git): its type, mode and, for a
    file, sha256, for a symlink, where it points: equal snapshots, equal trees."""
    entries: dict[str, tuple[Any, ...]] = {}
    for directory, dirs, files in os.walk(root):
        relative = Path(directory).relative_to(root)
        if relative == Path("."):
            dirs[:] = [name for name in dirs if name != ".git"]
        for name in dirs + files:
            path = Path(directory) / name
            info = os.lstat(path)
            key = (relative / name).as_posix()
            if stat.S_ISREG(info.st_mode):
                entries[key] = ("file", stat.S_IMODE(info.st_mode), _digest(path, info))
            elif stat.S_ISLNK(info.st_mode):
                entries[key] = ("symlink", os.readlink(path))
            else:
                entries[key] = (stat.filemode(info.st_mode), stat.S_IMODE(info.st_mode))
    return entries


_DIGESTS: dict[tuple[int, ...], str] = {}


def _digest(path: Path, info: os.stat_result) -> str:
    """sha256 of the file, remembered per inode and version: the fault loops' trees share
    the unchanged files by hard links (copy_tree), which sr-prefetch replaces, never edits."""
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _DIGESTS[key]


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """`directory` unwritable: by its mode, or, for root (whom modes do not stop), by the
    immutable attribute (chattr +i)."""
    if os.geteuid() != 0:
        mode = directory.stat().st_mode
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(mode)
        return
    if subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode:
        pytest.skip("running as root, and chattr +i cannot make a directory read-only here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)
