"""How far apart two engines of the same work run, read from committed timing records:
what one engine per arm can and cannot resolve.

Per record, runner and batch size, from each arm's median GPU time per step (a graph
replay for decode steps and MTP verify iterations, forward-gpu for mixed steps), in µs:

- stock-again - stock: the same code in two engines;
- floor - floor-rng: the floor runs strictly less than floor-rng (no draw at all, against
  one draw and the replay prologue), so where it comes out slower, two engines sit
  at least that far apart;
- reset - floor-rng, reset - floor: the default's distance from each floor.

And, from identity records (`--starts`), each engine's start in seconds (the worker's
engine construction: compile, graph capture and, for the reset copy, the seed op's
import), per cell, arms in name order. The identity check starts stock's engine of a
cell first and the other arms' engines side by side after it.

And, from the kernel profiles timing records keep (`--kernels`), per runner, batch
size and arm, its GPU kernels' µs per step less stock's, split between the kernels it
launches a different number of times (what its seed path changes) and those it
launches as stock does (what differs between any two engines), with the latter's
most apart (report.launch_split, report.most_apart); and (`--rng-path`) the kernels it
launches per step, with the seed path's among them (RNG_PATH).

    python -m bench.engine.offsets bench/results/*.timing.json
    python -m bench.engine.offsets --starts bench/results/engine-nvidia-h200-20261203*.identity.json
    python -m bench.engine.offsets --kernels bench/results/*.timing.json
    python -m bench.engine.offsets --rng-path bench/results/*.timing.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

PAIRS = (
    ("stock-again", "stock"),
    ("floor", "floor-rng"),
    ("reset", "floor-rng"),
    ("reset", "floor"),
)


def metric(record: dict[str, Any]) -> str:
    """forward_gpu_s where the record's samples have it (mixed steps), else replay_s."""
    for runner in record["runners"].values():
        for arms in runner["samples"].values():
            for samples in arms.values():
                if any("forward_gpu_s" in s for s in samples):
                    return "forward_gpu_s"
    return "replay_s"


def medians(arms: dict[str, list[dict[str, Any]]], name: str) -> dict[str, float]:
    """Each arm's median of `name` over its good samples, in µs."""
    out = {}
    for arm, samples in arms.items():
        values = [s[name] for s in samples if s.get("ok", True) and s.get(name) is not None]
        if values:
            out[arm] = statistics.median(values) * 1e6
    return out


def rows(record: dict[str, Any]) -> list[tuple[str, str, dict[str, float | None]]]:
    """(runner, batch size, {"a - b": µs or None where an arm is missing}) per cell."""
    name = metric(record)
    out = []
    for runner, data in record["runners"].items():
        for bs in sorted(data["samples"], key=int):
            m = medians(data["samples"][bs], name)
            out.append(
                (
                    runner,
                    bs,
                    {f"{a} - {b}": (m[a] - m[b]) if a in m and b in m else None for a, b in PAIRS},
                )
            )
    return out


def markdown(paths: Sequence[Path]) -> str:
    lines = [
        "| record | metric | runner | BS | " + " | ".join(f"{a} - {b}" for a, b in PAIRS) + " |",
        "| --- | --- | --- | ---: | " + " | ".join("---:" for _ in PAIRS) + " |",
    ]
    for path in paths:
        record = json.loads(Path(path).read_text())
        name = metric(record).removesuffix("_s").replace("_", "-")
        for runner, bs, diffs in rows(record):
            cells = ["-" if v is None else f"{v:+.1f}" for v in diffs.values()]
            stem = Path(path).name.removesuffix(".timing.json")
            lines.append(f"| {stem} | {name} | {runner} | {bs} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def starts_markdown(paths: Sequence[Path]) -> str:
    """Per identity record, runner and mode: each arm's engine start (s)."""
    lines = ["| record | runner | mode | engine starts (s) |", "| --- | --- | --- | --- |"]
    for path in paths:
        cells: dict[tuple[str, str], list[str]] = {}
        for key, runs in json.loads(Path(path).read_text())["records"].items():
            if key.count("/") != 2:  # a serving configuration's cell
                continue
            arm, runner, mode = key.split("/")
            for run in runs:
                cells.setdefault((runner, mode), []).append(f"{arm} {run['start_s']:.1f}")
        stem = Path(path).name.removesuffix(".identity.json")
        for (runner, mode), arms in sorted(cells.items()):
            lines.append(f"| {stem} | {runner} | {mode} | {', '.join(arms)} |")
    return "\n".join(lines) + "\n"


def profiles(paths: Sequence[Path]) -> Iterator[tuple[str, str, str, str, list, list]]:
    """Each profiled (record, runner, batch size, arm) of the timing records, arms in name
    order: its stem, runner, batch size and arm, its kernels ([name, launches, µs] per
    step) and stock's of the same cell ([] where stock has none)."""
    for path in paths:
        stem = Path(path).name.removesuffix(".timing.json")
        for runner, data in json.loads(Path(path).read_text())["runners"].items():
            per_arm = data.get("profile") or {}
            for bs in sorted({bs for per_bs in per_arm.values() for bs in per_bs}, key=int):
                stock = per_arm.get("stock", {}).get(bs, {}).get("kernels", [])
                for arm, per_bs in sorted(per_arm.items()):
                    kernels = per_bs.get(bs, {}).get("kernels")
                    if kernels is not None:
                        yield stem, runner, bs, arm, kernels, stock


def kernels_markdown(paths: Sequence[Path]) -> str:
    """Per record with profiles, runner, batch size and arm (stock-again included):
    µs less stock's in kernels launched otherwise and alike, and the latter's most apart."""
    from .report import launch_split, most_apart

    lines = [
        "| record | runner | BS | arm | launched otherwise (µs) | launched alike (µs) "
        "| launched alike, most apart from stock's (µs) |",
        "| --- | --- | ---: | --- | ---: | ---: | --- |",
    ]
    for stem, runner, bs, arm, rows, stock in profiles(paths):
        if arm == "stock" or not stock:
            continue
        base = {name: (n, us) for name, n, us in stock}
        kernels = {name: (n, us) for name, n, us in rows}
        otherwise, alike = launch_split(kernels, base)
        lines.append(
            f"| {stem} | {runner} | {bs} | {arm} | {otherwise:+.1f} | {alike:+.1f} "
            f"| {most_apart(kernels, base)} |"
        )
    return "\n".join(lines) + "\n"


RNG_PATH = (
    ("stock's draws", "random_from_to_kernel"),
    ("int64 fills", "FillFunctor<long>"),
    ("seed kernel", "stock_seeds_kernel"),
)
"""The seed path's kernels, by what their names contain: torch.randint's (stock's draw per
SSU call, floor-rng's one per forward); int64 fills, which in a decode step are the two
with which CUDAGraph.replay hands a graph that draws the generator's seed and offset
(its prologue; a mixed step's eager code may fill others); the reset design's op."""


def rng_path_markdown(paths: Sequence[Path]) -> str:
    """Per record with profiles, runner, batch size and arm: the kernels launched per
    step, and the launches and µs per step of each RNG_PATH kernel."""
    columns = " | ".join(f"{what} (launches, µs)" for what, _ in RNG_PATH)
    lines = [
        f"| record | runner | BS | arm | kernels per step | {columns} |",
        "| --- | --- | ---: | --- | ---: |" + " ---: |" * len(RNG_PATH),
    ]
    for stem, runner, bs, arm, kernels, _ in profiles(paths):
        cells = []
        for _, part in RNG_PATH:
            n = sum(launches for name, launches, _ in kernels if part in name)
            us = sum(us for name, _, us in kernels if part in name)
            cells.append(f"{n:g}, {us:.1f}" if n else "-")
        total = sum(launches for _, launches, _ in kernels)
        lines.append(f"| {stem} | {runner} | {bs} | {arm} | {total:g} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", type=Path)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--starts", action="store_true", help="engine starts of identity records")
    which.add_argument(
        "--kernels", action="store_true", help="kernel time per arm from the records' profiles"
    )
    which.add_argument(
        "--rng-path", action="store_true", help="the seed path's kernels from the records' profiles"
    )
    args = parser.parse_args(argv)
    table = (
        starts_markdown
        if args.starts
        else kernels_markdown
        if args.kernels
        else rng_path_markdown
        if args.rng_path
        else markdown
    )
    kind = "identity" if args.starts else "timing"
    try:
        print(table(sorted(args.records)), end="")
    except (OSError, ValueError) as error:
        raise SystemExit(f"offsets: {error}") from None
    except (KeyError, TypeError, AttributeError) as error:
        raise SystemExit(
            f"offsets: a record is not of the form {kind} records have ({error!r}): give "
            f"{kind} records (bench/results/*.{kind}.json)"
        ) from None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
