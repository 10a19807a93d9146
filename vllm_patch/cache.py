"""sr-prefetch's cache: where it keeps what it fetched and built, and what it says when
it cannot write there.

$SR_PREFETCH_CACHE, else ~/.cache/sr-prefetch, holds the pristine trees
(pristine-v2/), the files read from each release (files/), the sdists (sdists/, see
sdist.py), CI's wheels (wheels/), and the pre-commit checks' trees and caches
(sdist-trees/, mypy/).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from .releases import Release


class CacheError(Exception):
    """The cache cannot be written; the message says why and how to point it elsewhere."""


def cache_dir() -> Path:
    """Where pristine trees and release files live: $SR_PREFETCH_CACHE or
    ~/.cache/sr-prefetch."""
    configured = os.environ.get("SR_PREFETCH_CACHE")
    base = Path(configured) if configured else Path.home() / ".cache" / "sr-prefetch"
    return base.expanduser()


def wheel_dir() -> Path:
    """Where CI keeps the vLLM wheel it installs for the CPU tests (.ci/install-vllm.sh)."""
    return cache_dir() / "wheels"


def pristine_path(release: Release) -> Path:
    """Where the pristine tree of `release` is cached (a directory per layout: one built
    before setup.py and CMakeLists.txt were part of it, under pristine/, is not reused)."""
    return cache_dir() / "pristine-v2" / f"vllm-{release.version}"


def files_path(release: Release) -> Path:
    """Where the files read from `release` (sources.release_files) are cached."""
    return cache_dir() / "files" / release.version


@contextlib.contextmanager
def writing() -> Iterator[None]:
    """A block that writes into the cache: an OSError there becomes a CacheError that
    says what is in the way (write_problem) and how to fix it."""
    try:
        yield
    except OSError as error:
        cache = cache_dir()
        problem, kind = write_problem(error, cache)
        fix = {
            "file": "remove it, or point SR_PREFETCH_CACHE at a folder",
            "access": "make it writable, or point SR_PREFETCH_CACHE at a folder you may write",
            "full": "free space there, or point SR_PREFETCH_CACHE at a folder on another disk",
        }.get(kind, "point SR_PREFETCH_CACHE at another folder")
        raise CacheError(f"cannot write sr-prefetch's cache at {cache}: {problem}: {fix}") from None


_ACCESS = (errno.EACCES, errno.EPERM, errno.EROFS)
_FULL = (errno.ENOSPC, errno.EDQUOT)


def write_problem(error: OSError, path: Path) -> tuple[str, str]:
    """What stopped a write at or below `path`, in words, and its kind: "file" (a file
    stands where a folder must), "access" (a folder may not be written), "full" (no
    space), or "other"."""
    written = Path(error.filename) if error.filename else path
    if error.errno in (errno.ENOTDIR, errno.EEXIST):
        blocker = next(
            (p for p in (written, *written.parents) if p.exists() and not p.is_dir()), written
        )
        return f"{blocker} is a file, not a folder", "file"
    if error.errno in _ACCESS:
        folder = next((p for p in (written, *written.parents) if p.is_dir()), written)
        return (
            f"{folder} is not writable (its mode, its owner, or a read-only file system)",
            "access",
        )
    if error.errno in _FULL:
        return "its disk is full", "full"
    return error.strerror or str(error), "other"
