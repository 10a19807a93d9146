"""vLLM's source distributions, fetched from the index once and cached.

An sdist (`vllm-X.Y.Z.tar.gz`, 33-47 MB) carries what the wheel does not:
setup.py, pyproject.toml, the pre-commit configuration and tools/.  `fetch`
downloads it into the cache (sdists/), checked against the sha256 the index
records; everything else reads the cached file and downloads nothing, so a
test needs the install step (`python -m vllm_patch.sdist VERSION...`, run by
.ci/install-checks.sh) to have run first.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tarfile
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import releases, wheel
from .cache import cache_dir

INSTALL_STEP = "python -m vllm_patch.sdist"
"""The command that fetches sdists into the cache (CI runs it in .ci/install-checks.sh)."""

_CHUNK = 1 << 20


class SdistError(Exception):
    """An sdist could not be found, fetched or read; the message says which and why."""


class SdistMissing(SdistError):
    """The sdist is not in the cache; the message names the command that fetches it."""


def path(version: str) -> Path:
    """Where the sdist of vLLM `version` is cached."""
    return cache_dir() / "sdists" / f"vllm-{version}.tar.gz"


def cached(version: str) -> bool:
    return path(version).is_file()


def require(version: str) -> Path:
    """The cached sdist of `version`; SdistMissing, naming the install step, if absent."""
    if not cached(version):
        raise SdistMissing(
            f"vLLM {version}'s sdist is not in the cache ({path(version)}); fetch it with: "
            f"{INSTALL_STEP} {version}"
        )
    return path(version)


def fetch(version: str) -> Path:
    """The sdist of `version`, downloaded from the index into the cache unless there."""
    destination = path(version)
    if destination.is_file():
        return destination
    name = f"vllm-{version}.tar.gz"
    try:
        entry = next(
            (e for e in wheel.index_files() if e["filename"] == name and not e.get("yanked")),
            None,
        )
    except wheel.WheelError as error:
        raise SdistError(str(error)) from None
    if entry is None:
        raise SdistError(f"the index at {wheel.index_url()}/vllm/ has no {name}")
    expected = entry["hashes"]["sha256"]
    destination.parent.mkdir(parents=True, exist_ok=True)
    staged = destination.with_name(f".{name}.part")
    digest = hashlib.sha256()
    request = urllib.request.Request(entry["url"], headers={"User-Agent": "sr-prefetch"})
    try:
        with wheel.urlopen(request) as response, staged.open("wb") as out:
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except OSError as error:
        staged.unlink(missing_ok=True)
        raise SdistError(f"cannot download {name}: {error}") from None
    if digest.hexdigest() != expected:
        staged.unlink()
        raise SdistError(
            f"{name}: sha256 {digest.hexdigest()} is not the index's {expected}; nothing was kept"
        )
    staged.replace(destination)
    return destination


def read_members(version: str, names: Iterable[str]) -> dict[str, bytes]:
    """Members of the cached sdist, named from the source tree's root (e.g. `setup.py`);
    SdistError if one is absent."""
    wanted = set(names)
    prefix = f"vllm-{version}/"
    found: dict[str, bytes] = {}
    with tarfile.open(require(version)) as archive:
        for member in archive:
            name = member.name.removeprefix(prefix)
            if name in wanted and member.isfile():
                extracted = archive.extractfile(member)
                assert extracted is not None
                found[name] = extracted.read()
                if len(found) == len(wanted):
                    break
    absent = sorted(wanted - set(found))
    if absent:
        raise SdistError(f"vLLM {version}'s sdist has no {', '.join(absent)}")
    return found


def extract(version: str, destination: Path) -> Path:
    """The cached sdist's source tree, extracted into `destination` (created; must not exist)."""
    destination.mkdir(parents=True)
    staging = destination / ".extract"
    with tarfile.open(require(version)) as archive:
        archive.extractall(staging, filter="data")
    top = staging / f"vllm-{version}"
    for entry in top.iterdir():
        entry.rename(destination / entry.name)
    shutil.rmtree(staging)
    return destination


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=INSTALL_STEP, description="Fetch vLLM sdists into sr-prefetch's cache (once)."
    )
    parser.add_argument(
        "versions", nargs="*", metavar="VERSION", help="releases to fetch (default: all supported)"
    )
    args = parser.parse_args(argv)
    versions = args.versions or [release.version for release in releases.RELEASES]
    try:
        for version in versions:
            releases.get(version)  # refuses an unsupported one before any download
        with ThreadPoolExecutor(max_workers=4) as pool:
            for version, fetched in zip(versions, pool.map(fetch, versions), strict=True):
                print(f"vLLM {version}: {fetched}")
    except (SdistError, releases.UnsupportedRelease) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
