"""A release's sources, fetched once into the cache (cache.py): the files it ships
(release_files) and its pristine tree (pristine_tree), the git repository that `apply`
without PATH patches and `export` diffs against."""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
from pathlib import Path

from . import gitrepo, releases, sdist, wheel
from .cache import files_path, pristine_path, writing
from .releases import Release

_ELF_MAGIC = b"\x7fELF"


class FetchError(Exception):
    """A release's sources could not be fetched; the message says which and why."""


BUILD_FILES = ("setup.py", "CMakeLists.txt")
"""The files of a pristine tree that come from the release's sdist: a source tree's build
files, there as a fork's checkout has them (neither design edits them)."""


def pristine_tree(release: Release = releases.NEWEST) -> Path:
    """The pristine vLLM tree of `release` as a git repository in the cache, built once.

    Built from the release's PyPI wheel, read member by member over HTTP ranges
    (wheel.py; a few MB rather than the whole wheel): its `vllm/` package, less
    compiled binaries, which a fork's source tree does not track, and setup.py
    and CMakeLists.txt from its sdist (sdist.py), committed as "vLLM v<release>"
    and tagged v<release>.  The commit stays pristine: the commands change only the work
    tree, so `HEAD` is always the base to diff and export against.
    """
    target = pristine_path(release)
    if (target / ".git").is_dir():
        return target
    with writing():
        target.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"Fetching the vLLM {release.version} sources from PyPI into {target} (once) ...",
        file=sys.stderr,
    )
    try:
        members = wheel.read_members(release.version)
    except wheel.WheelError as error:
        raise FetchError(f"could not fetch vLLM {release.version}: {error}") from None
    with writing():
        _remove_stale_stagings(target)
        staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.{os.getpid()}.", dir=target.parent))
        try:
            for name, data in members.items():
                if not name.startswith("vllm/") or data.startswith(_ELF_MAGIC):
                    continue
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                (staging / name).write_bytes(data)
            for name, data in release_files(release, BUILD_FILES).items():
                (staging / name).write_bytes(data)
            gitrepo.init_tagged(staging, f"v{release.version}")
            try:
                staging.rename(target)
            except OSError:
                if not (target / ".git").is_dir():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _remove_stale_stagings(target: Path) -> None:
    """Removes the staging folders beside `target` of fetches that were killed before
    their rename (named `<target>.<pid>.<random>`; a live process's are kept)."""
    for staging in target.parent.glob(f"{glob.escape(target.name)}.*.*"):
        pid = staging.name[len(target.name) + 1 :].split(".")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def release_files(release: Release, paths: tuple[str, ...]) -> dict[str, bytes]:
    """`paths` of `release`, read once and cached: the package's files and its dist-info
    from its wheel over HTTP ranges, the others (BUILD_FILES) from its sdist."""
    folder = files_path(release)
    missing = [path for path in paths if not (folder / path).is_file()]
    if missing:
        wheel_dirs = ("vllm/", f"vllm-{release.version}.dist-info/")
        in_wheel = [path for path in missing if path.startswith(wheel_dirs)]
        try:
            fetched = wheel.read_members(release.version, in_wheel) if in_wheel else {}
            if len(in_wheel) < len(missing):
                sdist.fetch(release.version)
                fetched |= sdist.read_members(
                    release.version, [p for p in missing if p not in in_wheel]
                )
        except (wheel.WheelError, sdist.SdistError) as error:
            raise FetchError(f"could not fetch vLLM {release.version}: {error}") from None
        with writing():
            for path, data in fetched.items():
                (folder / path).parent.mkdir(parents=True, exist_ok=True)
                staged = (folder / path).with_name(f".{Path(path).name}.part")
                staged.write_bytes(data)
                staged.replace(folder / path)
    return {path: (folder / path).read_bytes() for path in paths}
