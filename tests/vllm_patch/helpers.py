"""Helpers shared by the sr-prefetch tests."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

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
