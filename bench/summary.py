"""From measured samples to the figures users compare: medians, ratios, recovered share.

Pure functions over plain data, so the arithmetic and the files it writes are
unit-tested on a machine without a GPU (bench/test_summary.py).

The figures, per (mode, batch size):
* median_us: median of the interleaved per-step samples of a variant;
* ratio_to_stock: median_us / stock's median_us (below 1 is faster);
* recovered: (stock - variant) / (stock - floor), the share of the removable
  RNG cost that the variant removes: 0 is stock, 1 is the no-draw floor;
* host_us (eager only): median host time to enqueue one step.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

STOCK = "stock"
"""The variant every other is compared with: an inline randint before each SSU."""
FLOOR = "floor"
"""The no-draw reference: one fixed seed tensor, nothing drawn."""

MODES = ("graph", "eager")
"""Mode names, in the order the tables show them."""

OK, SKIPPED, FAILED = "ok", "skipped", "failed"


@dataclass(frozen=True)
class Cell:
    """What one variant gave in one mode at one batch size.

    step_us: the interleaved samples, each the mean µs per step of one burst.
    host_us: eager only; samples of host µs to enqueue one step.
    status: OK, SKIPPED (could not be built here) or FAILED (wrong seeds, or
        it raised); reason says why for the last two.
    """

    variant: str
    mode: str
    batch_size: int
    step_us: tuple[float, ...] = ()
    host_us: tuple[float, ...] = ()
    status: str = OK
    reason: str | None = None


@dataclass(frozen=True)
class Row:
    """One line of the machine-readable summary."""

    variant: str
    mode: str
    batch_size: int
    median_us: float | None
    ratio_to_stock: float | None
    recovered: float | None
    host_us: float | None
    status: str
    reason: str | None

    def as_json(self) -> dict[str, object]:
        """The row's fields; times rounded to 0.01 µs and shares to 1e-4, finer being noise."""
        row = asdict(self)
        for key, digits in (
            ("median_us", 2),
            ("host_us", 2),
            ("ratio_to_stock", 4),
            ("recovered", 4),
        ):
            if row[key] is not None:
                row[key] = round(row[key], digits)
        return row


@dataclass(frozen=True)
class RunInfo:
    """What the summary's header says about the run."""

    gpu: str
    date: str
    """yyyymmdd, UTC."""
    command: str
    settings: tuple[str, ...] = field(default_factory=tuple)
    """One line each: versions, model shape, rounds."""
    tag: str = ""
    """Appended to the file names so runs of other shapes (GEMMs on) do not overwrite."""


def median(samples: Sequence[float]) -> float | None:
    return statistics.median(samples) if samples else None


def ratio_to_stock(variant_us: float, stock_us: float) -> float:
    return variant_us / stock_us


def recovered_share(variant_us: float, stock_us: float, floor_us: float) -> float | None:
    """(stock - variant) / (stock - floor); None where stock is not slower than the floor.

    With no removable cost measured the share is undefined, and printing a
    huge number from a denominator of noise would mislead.
    """
    removable = stock_us - floor_us
    if removable <= 0:
        return None
    return (stock_us - variant_us) / removable


def summarize(cells: Iterable[Cell]) -> list[Row]:
    """One row per cell, in the cells' order, each compared with its own mode and batch size."""
    cells = list(cells)
    medians = {
        (cell.variant, cell.mode, cell.batch_size): median(cell.step_us)
        for cell in cells
        if cell.status == OK
    }
    rows = []
    for cell in cells:
        value = medians.get((cell.variant, cell.mode, cell.batch_size))
        stock = medians.get((STOCK, cell.mode, cell.batch_size))
        floor = medians.get((FLOOR, cell.mode, cell.batch_size))
        rows.append(
            Row(
                variant=cell.variant,
                mode=cell.mode,
                batch_size=cell.batch_size,
                median_us=value,
                ratio_to_stock=None if value is None or not stock else ratio_to_stock(value, stock),
                recovered=(
                    None
                    if value is None or stock is None or floor is None
                    else recovered_share(value, stock, floor)
                ),
                host_us=median(cell.host_us),
                status=cell.status,
                reason=cell.reason,
            )
        )
    return rows


def gpu_slug(gpu_name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': a file-name-safe lower-case name."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")
    return slug or "gpu"


def summary_stem(info: RunInfo) -> str:
    """`<gpu-slug>-<yyyymmdd>`, then `-<tag>` when the run has one."""
    stem = f"{gpu_slug(info.gpu)}-{info.date}"
    return f"{stem}-{info.tag}" if info.tag else stem


def _ordered(values: Iterable[object]) -> list:
    """Distinct values in first-seen order."""
    return list(dict.fromkeys(values))


def _cell_text(row: Row) -> str:
    if row.status == SKIPPED:
        return "skipped"
    if row.status == FAILED:
        return "**FAILED**"
    if row.median_us is None:
        return "-"
    figures = []
    if row.ratio_to_stock is not None:
        figures.append(f"{row.ratio_to_stock:.3f}x")
    if row.recovered is not None:
        figures.append(f"rec {row.recovered:.2f}")
    return f"{row.median_us:.1f} ({', '.join(figures)})" if figures else f"{row.median_us:.1f}"


def _host_text(row: Row) -> str:
    if row.status != OK:
        return _cell_text(row)
    return "-" if row.host_us is None else f"{row.host_us:.0f}"


def _table(rows: Sequence[Row], mode: str, text: Callable[[Row], str]) -> list[str]:
    batch_sizes = _ordered(row.batch_size for row in rows)
    variants = _ordered(row.variant for row in rows)
    by_key = {(row.variant, row.batch_size): row for row in rows if row.mode == mode}
    lines = [
        "| variant | " + " | ".join(f"BS{bs}" for bs in batch_sizes) + " |",
        "| --- |" + " ---: |" * len(batch_sizes),
    ]
    for variant in variants:
        cells = [by_key.get((variant, bs)) for bs in batch_sizes]
        if all(cell is None for cell in cells):
            continue
        shown = [text(cell) if cell is not None else "" for cell in cells]
        lines.append(f"| {variant} | " + " | ".join(shown) + " |")
    return lines


_MODE_TITLES = {
    "graph": "CUDA-graph replay: µs per step",
    "eager": "Eager: µs per step",
}


def markdown(rows: Sequence[Row], info: RunInfo) -> str:
    """The human-readable summary: a table per mode, host times, why any variant is missing."""
    lines = [
        f"# SSU seed step time: {info.gpu}, {info.date[:4]}-{info.date[4:6]}-{info.date[6:]}",
        "",
        f"Command: `{info.command}`",
        "",
        *(f"- {setting}" for setting in info.settings),
        "",
        "Cells: median µs per step (ratio to stock, rec = recovered share "
        "= (stock - variant) / (stock - floor)).",
    ]
    modes = [mode for mode in MODES if any(row.mode == mode for row in rows)]
    for mode in modes:
        lines += ["", f"## {_MODE_TITLES.get(mode, mode)}", "", *_table(rows, mode, _cell_text)]
    if any(row.mode == "eager" and row.host_us is not None for row in rows):
        lines += [
            "",
            "## Eager: host µs to enqueue one step",
            "",
            *_table(rows, "eager", _host_text),
        ]
    problems = _ordered(
        (row.variant, row.status, row.reason) for row in rows if row.status != OK and row.reason
    )
    if problems:
        lines += ["", "## Not measured", ""]
        lines += [f"- {variant}: {status}: {reason}" for variant, status, reason in problems]
    return "\n".join(lines) + "\n"


def write_summary(rows: Sequence[Row], info: RunInfo, out_dir: Path) -> tuple[Path, Path]:
    """Writes `<stem>.summary.json` (a list of row objects) and `<stem>.md`; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = summary_stem(info)
    json_path = out_dir / f"{stem}.summary.json"
    md_path = out_dir / f"{stem}.md"
    json_path.write_text(json.dumps([row.as_json() for row in rows], indent=1) + "\n")
    md_path.write_text(markdown(rows, info))
    return json_path, md_path
