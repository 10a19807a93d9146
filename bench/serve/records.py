"""The serve run's records: one cell per (runner, round, arm), each with its parts (the
identity record, each shape's blocks of figures, the engagement lines) and its
server's starts (`starts`, seconds to /health; a resumed round starts its servers
again), kept in a JSON file that a run cut off by a time limit resumes from
(SR_SERVE_RESUME).

A shape's entry is {"blocks": [...], "shape": ..., "argv": ...}: one kept dict per
`vllm bench serve` run (bench_client.summary, with `block` its index, `slot` its arm's
place in that block's order, `start` the index in `starts` of the server that ran it,
and `gpus` and `host` where sampled), in block order; `argv` is the latest block's
(blocks differ in --port and the result file only).  An entry without "blocks" (a
run of the one-server-at-a-time layout) reads as block 0 (blocks_of).
"""

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


def blocks_of(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """A shape entry's blocks; an entry without "blocks" is one block, block 0."""
    if "blocks" in entry:
        return entry["blocks"]
    return [{**{k: v for k, v in entry.items() if k not in ("shape", "argv")}, "block": 0}]


def starts_of(cell: dict[str, Any]) -> list[float]:
    """Each start's seconds to /health (a cell without `starts` has one, in `start_s`)."""
    return cell.get("starts", [cell["start_s"]] if "start_s" in cell else [])


def add_block(
    cell: dict[str, Any], shape: str, kept: dict[str, Any], extra: dict[str, Any]
) -> None:
    """kept (with its `block`) in the cell's shape entry, in block order; extra (the
    entry's shape and argv) replaces the entry's."""
    entry = cell.setdefault("bench", {}).setdefault(shape, {"blocks": []})
    entry["blocks"] = sorted(
        [b for b in entry["blocks"] if b["block"] != kept["block"]] + [kept],
        key=lambda b: b["block"],
    )
    entry.update(extra)


def missing(
    cell: dict[str, Any] | None, shapes: tuple[Shape, ...], identity: bool, blocks: int
) -> tuple[bool, dict[str, list[int]]]:
    """What a cell still lacks: the identity record (where wanted) and, per shape with
    any, the blocks (indices 0..blocks-1) without figures; a part that failed counts
    as missing."""
    cell = cell or {}
    need_identity = identity and "identity" not in cell
    todo = {}
    for shape in shapes:
        entry = cell.get("bench", {}).get(shape.name)
        done = {b["block"] for b in blocks_of(entry)} if entry else set()
        lacking = [b for b in range(blocks) if b not in done]
        if lacking:
            todo[shape.name] = lacking
    return need_identity, todo
