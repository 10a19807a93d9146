"""Writes pristine_sha256.json: the sha256 of each file the patch changes, as each
release ships it in its wheel; run `python -m vllm_patch.pristine` after a release is
added to releases.RELEASES.  A module of its own, as it needs both the release table
and the targets, which import the table."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from . import sources, targets
from .releases import RELEASES


def refresh() -> None:
    """Reads every release's target files (sources.release_files) and writes their sha256."""
    data: dict[str, dict[str, str]] = {}
    for release in RELEASES:
        paths = targets.paths(release)
        files = sources.release_files(release, paths)
        data[release.version] = {path: hashlib.sha256(files[path]).hexdigest() for path in paths}
        print(release.version, "ok")
    Path(__file__).with_name("pristine_sha256.json").write_text(
        json.dumps(data, indent=1, sort_keys=True) + "\n"
    )


if __name__ == "__main__":
    refresh()
