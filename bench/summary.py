"""From measured samples to the figures users compare: medians with their spread, ratios, ties.

Pure functions over plain data, so the arithmetic and the files it writes are
unit-tested on a machine without a GPU (bench/test_summary.py).

The figures, per (mode, batch size):
* median_us: median of the interleaved per-step samples of a variant, with
  median_ci95_us, a 95% percentile-bootstrap interval of that median
  (stats.py: rounds resampled, the same rounds for every variant), and
  iqr_us / quartiles_us, the spread of the samples themselves;
* ratio_to_stock: median_us / stock's median_us (below 1 is faster), and
  ratio_ci95 from the same resamples (the ratio of the two medians in each);
* recovered: (stock - variant) / (stock - floor), the share of the removable
  RNG cost that the variant removes: 0 is stock, 1 is the no-draw floor; and
  recovered_ci95 likewise;
* recovered_vs_drawing_floor: the same share against the drawing floor
  (FLOOR_RNG) instead, the least a path that draws its seeds from the
  generator can cost, with recovered_vs_drawing_floor_ci95;
* ties: the other variants whose median's 95% interval overlaps this one's,
  so that no ranking claims a difference the run did not resolve;
* host_us (eager only): median host time to enqueue one step, with
  host_ci95_us and host_iqr_us.

An interval needs stats.MIN_SAMPLES rounds; with fewer, the intervals and
ties are None / empty and the tables say so.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .stats import (
    BOOTSTRAP_SEED,
    CONFIDENCE,
    MIN_SAMPLES,
    RESAMPLES,
    Interval,
    bootstrap_medians,
    interval_of,
    overlap,
    percentile_interval,
    quartiles,
    seeded_rng,
)

STOCK = "stock"
"""The variant every other is compared with: an inline randint before each SSU."""
FLOOR = "floor"
"""The no-draw reference: one fixed seed tensor, nothing drawn."""
FLOOR_RNG = "floor-rng"
"""The drawing floor: the floor plus one one-element draw from the default
generator per forward.  Any seed path that keeps stock's values draws from that
generator inside each forward, graphed ones included, so it pays at least this:
one RNG kernel and, before each replay of a graph that draws, torch's replay
prologue (two fill kernels that hand the graph the generator's seed and offset;
a graph that draws nothing skips them)."""
REFERENCES = (FLOOR, FLOOR_RNG)
"""Variants that are yardsticks rather than seed paths: their seeds are fixed."""

MODES = ("graph", "eager")
"""Mode names, in the order the tables show them."""

OK, SKIPPED, FAILED = "ok", "skipped", "failed"


@dataclass(frozen=True)
class Cell:
    """What one variant gave in one mode at one batch size.

    step_us: the interleaved samples, each the mean µs per step of one burst;
        sample r of every variant of a (mode, batch size) comes from round r.
    host_us: eager only; samples of host µs to enqueue one step, by round too.
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
    """One line of the machine-readable summary (module docstring: what each figure is)."""

    variant: str
    mode: str
    batch_size: int
    samples: int
    median_us: float | None
    median_ci95_us: Interval | None
    iqr_us: float | None
    quartiles_us: Interval | None
    ratio_to_stock: float | None
    ratio_ci95: Interval | None
    recovered: float | None
    recovered_ci95: Interval | None
    recovered_vs_drawing_floor: float | None
    recovered_vs_drawing_floor_ci95: Interval | None
    ties: tuple[str, ...]
    host_us: float | None
    host_ci95_us: Interval | None
    host_iqr_us: float | None
    status: str
    reason: str | None

    def as_json(self) -> dict[str, object]:
        """The row's fields; times rounded to 0.01 µs and shares to 1e-4, finer being noise."""
        row = asdict(self)
        for key, digits in (
            ("median_us", 2),
            ("median_ci95_us", 2),
            ("iqr_us", 2),
            ("quartiles_us", 2),
            ("host_us", 2),
            ("host_ci95_us", 2),
            ("host_iqr_us", 2),
            ("ratio_to_stock", 4),
            ("ratio_ci95", 4),
            ("recovered", 4),
            ("recovered_ci95", 4),
            ("recovered_vs_drawing_floor", 4),
            ("recovered_vs_drawing_floor_ci95", 4),
        ):
            value = row[key]
            if isinstance(value, (tuple, list)):
                row[key] = [round(bound, digits) for bound in value]
            elif value is not None:
                row[key] = round(value, digits)
        row["ties"] = list(self.ties)
        return row


@dataclass(frozen=True)
class RunInfo:
    """What the summary's header says about the run."""

    gpu: str
    date: str
    """yyyymmdd, UTC."""
    command: str
    settings: tuple[str, ...] = field(default_factory=tuple)
    """One line each: versions, model shape, rounds, round-order seed."""
    tag: str = ""
    """Appended to the file names so runs of other shapes (GEMMs on) do not overwrite."""


def median(samples: Sequence[float]) -> float | None:
    return statistics.median(samples) if samples else None


def ratio_to_stock(variant_us: float, stock_us: float) -> float | None:
    """variant / stock; None where stock is not positive."""
    return variant_us / stock_us if stock_us > 0 else None


def recovered_share(variant_us: float, stock_us: float, floor_us: float) -> float | None:
    """(stock - variant) / (stock - floor); None where stock is not slower than the floor.

    With no removable cost measured the share is undefined, and printing a
    huge number from a denominator of noise would mislead.
    """
    removable = stock_us - floor_us
    if removable <= 0:
        return None
    return (stock_us - variant_us) / removable


@dataclass(frozen=True)
class _Spread:
    """A variant's figures within its (mode, batch size)."""

    median_us: float | None
    median_ci95_us: Interval | None = None
    quartiles_us: Interval | None = None
    ratio_to_stock: float | None = None
    ratio_ci95: Interval | None = None
    recovered: float | None = None
    recovered_ci95: Interval | None = None
    recovered_vs_drawing_floor: float | None = None
    recovered_vs_drawing_floor_ci95: Interval | None = None
    host_us: float | None = None
    host_ci95_us: Interval | None = None
    host_quartiles_us: Interval | None = None


def _iqr(bounds: Interval | None) -> float | None:
    return None if bounds is None else bounds[1] - bounds[0]


def _group_spreads(
    mode: str, batch_size: int, cells: Sequence[Cell], resamples: int, seed: int
) -> dict[str, _Spread]:
    """The figures of the measured variants of one (mode, batch size), by variant."""
    step = {cell.variant: cell.step_us for cell in cells}
    host = {cell.variant: cell.host_us for cell in cells}
    medians = {name: median(values) for name, values in step.items()}
    host_medians = {name: median(values) for name, values in host.items()}

    def boot(samples: dict[str, tuple[float, ...]], what: str) -> dict[str, list[float]]:
        enough = {name: values for name, values in samples.items() if len(values) >= MIN_SAMPLES}
        rng = seeded_rng(seed, mode, f"bs{batch_size}", what)
        return bootstrap_medians(enough, rng=rng, resamples=resamples)

    step_boot, host_boot = boot(step, "step"), boot(host, "host")
    stock = medians.get(STOCK)

    def share(name: str, reference: str) -> tuple[float | None, Interval | None]:
        """`name`'s recovered share against `reference`, and its interval."""
        value, bottom = medians[name], medians.get(reference)
        if value is None or stock is None or bottom is None:
            return None, None
        if not {name, STOCK, reference} <= step_boot.keys():
            return recovered_share(value, stock, bottom), None
        paired = [step_boot[name], step_boot[STOCK], step_boot[reference]]
        return recovered_share(value, stock, bottom), interval_of(paired, recovered_share)

    spreads = {}
    for name, value in medians.items():
        ratio = ratio_ci = None
        if value is not None and stock is not None:
            ratio = ratio_to_stock(value, stock)
            if name in step_boot and STOCK in step_boot:
                ratio_ci = interval_of([step_boot[name], step_boot[STOCK]], ratio_to_stock)
        recovered, recovered_ci = share(name, FLOOR)
        drawing, drawing_ci = share(name, FLOOR_RNG)
        spreads[name] = _Spread(
            median_us=value,
            median_ci95_us=percentile_interval(step_boot[name]) if name in step_boot else None,
            quartiles_us=quartiles(step[name]),
            ratio_to_stock=ratio,
            ratio_ci95=ratio_ci,
            recovered=recovered,
            recovered_ci95=recovered_ci,
            recovered_vs_drawing_floor=drawing,
            recovered_vs_drawing_floor_ci95=drawing_ci,
            host_us=host_medians[name],
            host_ci95_us=percentile_interval(host_boot[name]) if name in host_boot else None,
            host_quartiles_us=quartiles(host[name]),
        )
    return spreads


def summarize(
    cells: Iterable[Cell], *, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> list[Row]:
    """One row per cell, in the cells' order, each compared with its own mode and batch size.

    The bootstrap of each (mode, batch size) draws from its own generator,
    derived from `seed` and the group's name, so a group's figures do not
    depend on which other groups are summarized with it.
    """
    cells = list(cells)
    groups: dict[tuple[str, int], list[Cell]] = {}
    for cell in cells:
        if cell.status == OK:
            groups.setdefault((cell.mode, cell.batch_size), []).append(cell)
    spreads = {
        (name, mode, batch_size): spread
        for (mode, batch_size), members in groups.items()
        for name, spread in _group_spreads(mode, batch_size, members, resamples, seed).items()
    }
    rows = []
    for cell in cells:
        spread = spreads.get((cell.variant, cell.mode, cell.batch_size), _Spread(None))
        ties = ()
        if spread.median_ci95_us is not None:
            ties = tuple(
                other.variant
                for other in groups.get((cell.mode, cell.batch_size), ())
                if other.variant != cell.variant
                and (theirs := spreads[other.variant, cell.mode, cell.batch_size].median_ci95_us)
                and overlap(spread.median_ci95_us, theirs)
            )
        rows.append(
            Row(
                variant=cell.variant,
                mode=cell.mode,
                batch_size=cell.batch_size,
                samples=len(cell.step_us),
                median_us=spread.median_us,
                median_ci95_us=spread.median_ci95_us,
                iqr_us=_iqr(spread.quartiles_us),
                quartiles_us=spread.quartiles_us,
                ratio_to_stock=spread.ratio_to_stock,
                ratio_ci95=spread.ratio_ci95,
                recovered=spread.recovered,
                recovered_ci95=spread.recovered_ci95,
                recovered_vs_drawing_floor=spread.recovered_vs_drawing_floor,
                recovered_vs_drawing_floor_ci95=spread.recovered_vs_drawing_floor_ci95,
                ties=ties,
                host_us=spread.host_us,
                host_ci95_us=spread.host_ci95_us,
                host_iqr_us=_iqr(spread.host_quartiles_us),
                status=cell.status,
                reason=cell.reason,
            )
        )
    return rows


def fastest(rows: Iterable[Row]) -> Row | None:
    """The seed path with the lowest median among `rows` (one mode and size); not a floor.

    The floors' seeds are fixed, so they are the references a seed path is
    measured against, not contenders.  Equal medians: the first in the rows' order.
    """
    measured = [
        (row.median_us, index, row)
        for index, row in enumerate(rows)
        if row.status == OK and row.median_us is not None and row.variant not in REFERENCES
    ]
    return min(measured)[2] if measured else None


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


def _interval_text(bounds: Interval | None, digits: int) -> str:
    return "n/a" if bounds is None else f"[{bounds[0]:.{digits}f}, {bounds[1]:.{digits}f}]"


def _figure_text(value: float | None, bounds: Interval | None, digits: int, exact: bool) -> str:
    """A derived figure and its interval; `exact`: a reference's value by definition, alone."""
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return text if exact else f"{text} {_interval_text(bounds, digits)}"


def _host_text(row: Row) -> str:
    if row.host_us is None:
        return "-"
    iqr = "" if row.host_iqr_us is None else f", IQR {row.host_iqr_us:.0f}"
    return f"{row.host_us:.0f} {_interval_text(row.host_ci95_us, 0)}{iqr}"


def _row_cells(row: Row, with_host: bool) -> list[str]:
    if row.status != OK or row.median_us is None:
        shown = {SKIPPED: "skipped", FAILED: "**FAILED**"}.get(row.status, "-")
        return [shown] + [""] * (7 if with_host else 6)
    cells = [
        f"{row.median_us:.1f}",
        _interval_text(row.median_ci95_us, 1),
        "n/a" if row.iqr_us is None else f"{row.iqr_us:.1f}",
        _figure_text(row.ratio_to_stock, row.ratio_ci95, 3, exact=row.variant == STOCK),
        _figure_text(row.recovered, row.recovered_ci95, 2, exact=row.variant in (STOCK, FLOOR)),
        _figure_text(
            row.recovered_vs_drawing_floor,
            row.recovered_vs_drawing_floor_ci95,
            2,
            exact=row.variant in (STOCK, FLOOR_RNG),
        ),
        (", ".join(row.ties) or "none") if row.median_ci95_us is not None else "n/a",
    ]
    return [*cells, _host_text(row)] if with_host else cells


def _fastest_text(rows: Sequence[Row]) -> str | None:
    best = fastest(rows)
    if best is None:
        return None
    assert best.median_us is not None
    if best.median_ci95_us is None:
        return (
            f"Fastest seed path by median: {best.variant}, {best.median_us:.1f} µs; "
            f"no intervals (fewer than {MIN_SAMPLES} rounds), so ties are not judged."
        )
    head = (
        f"Fastest seed path: **{best.variant}**, {best.median_us:.1f} µs "
        f"{_interval_text(best.median_ci95_us, 1)}"
    )
    if best.ties:
        return f"{head}; tie with {', '.join(best.ties)} (95% intervals of the medians overlap)."
    return f"{head}; no other variant's 95% interval overlaps it."


def _table(rows: Sequence[Row], with_host: bool) -> list[str]:
    header = [
        "variant",
        "median µs",
        "95% CI",
        "IQR",
        "ratio to stock [95% CI]",
        "recovered [95% CI]",
        "recovered vs floor-rng [95% CI]",
        "ties (95% CIs overlap)",
    ]
    align = [" --- |", *[" ---: |"] * 6, " --- |"]
    if with_host:
        header.append("host µs [95% CI], IQR")
        align.append(" ---: |")
    lines = ["| " + " | ".join(header) + " |", "|" + "".join(align)]
    for row in rows:
        lines.append(f"| {row.variant} | " + " | ".join(_row_cells(row, with_host)) + " |")
    return lines


_MODE_TITLES = {
    "graph": "CUDA-graph replay: µs per step",
    "eager": "Eager: µs per step, and host µs to enqueue one",
}


def legend(resamples: int = RESAMPLES) -> list[str]:
    """What the columns of the tables mean, as markdown lines."""
    confidence = f"{CONFIDENCE:.0%}"
    return [
        "Per mode and batch size, one row per variant:",
        "",
        f"- **median µs** per step over the rounds; **{confidence} CI**: percentile bootstrap of "
        f"that median, {resamples} resamples of the rounds (fixed seed {BOOTSTRAP_SEED}); "
        "**IQR**: interquartile range of the samples (their spread, not the median's "
        "uncertainty);",
        "- **ratio to stock** = variant / stock and **recovered** = (stock - variant) / "
        "(stock - floor), of the medians, each with its 95% interval from the same "
        "resamples, the same rounds for every variant (paired); a reference's exact value "
        "(stock's 1, the floor's recovered 1) has none;",
        "- **recovered vs floor-rng** = (stock - variant) / (stock - floor-rng): the same share "
        "against the drawing floor, the floor plus one one-element draw per forward. Every "
        "path that keeps stock's seeds draws from the generator inside the forward, so it "
        "pays at least that: one RNG kernel, and before each replay of a graph that draws, "
        "torch's replay prologue (two fill kernels; a graph that draws nothing skips them);",
        "- **ties**: the other variants whose median's 95% interval overlaps this one's: "
        "differences this run does not resolve (overlap is a conservative test);",
        "- **host µs** (eager): median wall time to enqueue one step onto an idle GPU, "
        "with its 95% interval and IQR.",
        "",
        "Below each table, the fastest seed path (the floors' seeds are fixed, so they are "
        "references, not contenders) and every variant that ties with it.",
    ]


def markdown(rows: Sequence[Row], info: RunInfo, resamples: int = RESAMPLES) -> str:
    """The human-readable summary: a table per mode and batch size, why any variant is missing."""
    lines = [
        f"# SSU seed step time: {info.gpu}, {info.date[:4]}-{info.date[4:6]}-{info.date[6:]}",
        "",
        f"Command: `{info.command}`",
        "",
        *(f"- {setting}" for setting in info.settings),
        "",
        *legend(resamples),
    ]
    batch_sizes = _ordered(row.batch_size for row in rows)
    for mode in (mode for mode in MODES if any(row.mode == mode for row in rows)):
        lines += ["", f"## {_MODE_TITLES.get(mode, mode)}"]
        for batch_size in batch_sizes:
            group = [row for row in rows if (row.mode, row.batch_size) == (mode, batch_size)]
            if not group:
                continue
            with_host = any(row.host_us is not None for row in group)
            lines += ["", f"### BS{batch_size}", "", *_table(group, with_host)]
            note = _fastest_text(group)
            if note:
                lines += ["", note]
    problems = _ordered(
        (row.variant, row.status, row.reason) for row in rows if row.status != OK and row.reason
    )
    if problems:
        lines += ["", "## Not measured", ""]
        lines += [f"- {variant}: {status}: {reason}" for variant, status, reason in problems]
    return "\n".join(lines) + "\n"


def write_summary(
    rows: Sequence[Row], info: RunInfo, out_dir: Path, resamples: int = RESAMPLES
) -> tuple[Path, Path]:
    """Writes `<stem>.summary.json` (a list of row objects) and `<stem>.md`; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = summary_stem(info)
    json_path = out_dir / f"{stem}.summary.json"
    md_path = out_dir / f"{stem}.md"
    json_path.write_text(json.dumps([row.as_json() for row in rows], indent=1) + "\n")
    md_path.write_text(markdown(rows, info, resamples))
    return json_path, md_path
