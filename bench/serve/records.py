"""The serve run's records: one cell per (runner, round, arm) server, each with its
parts (the identity record, each shape's figures, the engagement lines), kept in a
JSON file that a run cut off by a time limit resumes from (SR_SERVE_RESUME)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .settings import Shape


def cell_key(runner: str, pair: int, arm: str) -> str:
    return f"{runner}/p{pair}/{arm}"


def parse_key(key: str) -> tuple[str, int, str]:
    runner, pair, arm = key.split("/", 2)
    return runner, int(pair[1:]), arm


def empty() -> dict[str, Any]:
    return {"cells": {}, "meta": {}}


def load(path: str | Path | None) -> dict[str, Any]:
    """The records at path (an empty set where there is none)."""
    if not path or not Path(path).is_file():
        return empty()
    data = json.loads(Path(path).read_text())
    data.setdefault("cells", {})
    data.setdefault("meta", {})
    return data


def save(paths: list[Path], data: dict[str, Any]) -> None:
    """Written whole to each path, through a temporary file (a cut leaves the last one)."""
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def committed_text(data: dict[str, Any]) -> str:
    """The records in their committed form: one line per cell, then the meta."""
    cells = ",\n".join(
        f"  {json.dumps(key)}: {json.dumps(cell, sort_keys=True)}"
        for key, cell in sorted(data["cells"].items())
    )
    return (
        '{"cells": {\n'
        + cells
        + '\n },\n "meta": '
        + json.dumps(data["meta"], sort_keys=True)
        + "}\n"
    )


def missing(
    cell: dict[str, Any] | None, shapes: tuple[Shape, ...], identity: bool
) -> tuple[bool, list[Shape]]:
    """What a cell still lacks: the identity record (where wanted) and the shapes
    without figures; a part that failed counts as missing."""
    cell = cell or {}
    need_identity = identity and "identity" not in cell
    done = cell.get("bench", {})
    return need_identity, [s for s in shapes if s.name not in done]
