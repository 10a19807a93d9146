"""Helpers shared by the sr-prefetch tests."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path


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
