"""The figures the exported commit message quotes, read from the committed GPU results.

Each figure is read, when the message is written, from one committed file of
this repository: a timing table of an engine run (`bench/results/*.md`, the
tables `python -m bench.engine.report` writes), a pytest log of a GPU run
(`tests/gpu/results/*.log`), or a sentence of a run's write-up.  A `Figure`
keeps the file it came from and the numbers as that file writes them, so that
tests/vllm_patch/test_commit_message.py can check every quoted number against
its file.  The message names no file of this repository: it says where and how
a figure was measured (one H200, vLLM 0.26.0, the harness described in words).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .tree import TreeError

ROOT = Path(__file__).resolve().parent.parent
"""The repository: the results files are read from its work tree (an editable install,
as the README's install step makes)."""

DECODE = "bench/results/engine-nvidia-h200-20261201e-decode.md"
"""Decode steps, FULL_AND_PIECEWISE, V1 and V2, 10 rounds (run e, one H200, vLLM 0.26.0)."""
DECODE_RUN = "bench/results/engine-nvidia-h200-20261201e.md"
MTP3 = "bench/results/engine-nvidia-h200-20261202-mtp3.md"
"""MTP K=3 verify iterations, V1 and V2, 8 rounds (run g)."""
MTP7 = "bench/results/engine-nvidia-h200-20261202-mtp7-v1.md"
"""MTP K=7 verify iterations, V1, 8 rounds (run g)."""
MTP_RUN = "bench/results/engine-nvidia-h200-20261202.md"
MIXED_V1 = "bench/results/engine-nvidia-h200-20261201f-mixed.md"
"""Mixed prefill/decode steps under PIECEWISE, V1, 4 engines per arm (run f)."""
MIXED_V2 = "bench/results/engine-nvidia-h200-20261202-mixed-v2.md"
"""The same on V2, 3 engines per arm (runs f and g)."""
MIXED_RUN = "bench/results/engine-nvidia-h200-20261201f.md"
IDENTITY_PLAIN = "bench/results/engine-nvidia-h200-20261201d-plain.md"
IDENTITY_PLAIN_LOG = "tests/gpu/results/engine-identity-vllm-0.26.0-nvidia-h200-20261201d-plain.log"
IDENTITY_SERVING_LOG = (
    "tests/gpu/results/engine-identity-vllm-0.26.0-nvidia-h200-20261201d-serving.log"
)
IDENTITY_SERVING = "bench/results/engine-nvidia-h200-20261201d-serving.md"
IDENTITY_RESHAPE_LOG = (
    "tests/gpu/results/engine-identity-vllm-0.26.0-nvidia-h200-20261203-reset.log"
)
"""The reset design as it lands, V1 (the device time ran out before V2's cells)."""
IDENTITY_RESHAPE_V2_LOG = (
    "tests/gpu/results/engine-identity-vllm-0.26.0-nvidia-h200-20261203b-reset-v2.log"
)
"""The same, V2, eager and FULL_AND_PIECEWISE."""
IDENTITY_TRITON_LOG = (
    "tests/gpu/results/engine-identity-vllm-0.26.0-nvidia-h100-20261207-triton.log"
)
"""The reset design with the Triton seed kernel, V1 and V2, FULL_AND_PIECEWISE."""
IDENTITY_020_LOG = "tests/gpu/results/engine-identity-vllm-0.20.0-nvidia-h200-20261202.log"
FORK_TEST_026_LOG = "tests/gpu/results/patched-vllm-0.26.0-nvidia-h200.log"
SEED_KERNEL_LOG = "tests/gpu/results/nvidia-h200-20261202-seed-kernel.log"

DEFAULT_ARM = "reset-kernel"
"""The reset design's arm as it lands (the seed kernel on the forward's stream), as the
committed reports' tables name it: today's `reset` (bench/results/README.md)."""
FORWARD_CONTEXT_ARM = "forward-context"
SINGLE_DRAW_ARM = "floor-rng"
"""No per-layer draws, one one-element draw per forward: the least a stock-identical
seed path can cost under CUDA graphs (a graph that draws at all pays torch's replay
prologue)."""
NO_DRAW_ARM = "floor"
"""One fixed seed, no draws (not stock-identical): what the draws cost."""


class EvidenceError(TreeError):
    """A results file the message quotes is missing, or no longer holds the figure."""


@dataclass(frozen=True)
class Figure:
    """One figure as the message writes it ("67-78", "26"), the committed files it is
    read from, and the numbers it is made of as those files write them (each is in one
    of them)."""

    text: str
    sources: tuple[str, ...]
    values: tuple[str, ...]

    def __str__(self) -> str:
        return self.text


def read(source: str) -> str:
    """The text of the committed file `source` (a path from the repository's root)."""
    path = ROOT / source
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        raise EvidenceError(
            f"the commit message quotes {source}, which is not at {path}: export reads the "
            "committed GPU results from the repository (install it with pip install -e)"
        ) from None


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _number(cell: str) -> str:
    """The first number of a table cell ("74 [74, 76]" -> "74")."""
    match = _NUMBER.search(cell)
    if match is None:
        raise ValueError(f"no number in {cell!r}")
    return match.group()


def report_rows(source: str, table: str) -> list[dict[str, str]]:
    """The rows of the table headed `**{table}** (µs)` in an engine report (e.g. table
    "v1, replay"), each a dict by column."""
    lines = read(source).splitlines()
    heading = f"**{table}** (µs)"
    if heading not in lines:
        raise EvidenceError(f"{source} has no table {heading}")
    header: list[str] | None = None
    rows = []
    for line in lines[lines.index(heading) + 1 :]:
        if not line.startswith("|"):
            if header is not None:
                break
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


def column(source: str, tables: Iterable[str], arm: str, name: str) -> list[str]:
    """The first number of column `name` in the rows of `arm`, over `tables`."""
    values = [
        _number(row[name])
        for table in tables
        for row in report_rows(source, table)
        if row["arm"] == arm
    ]
    if not values:
        raise EvidenceError(f"{source}: no rows of {arm} in {', '.join(tables)}")
    return values


def span(values: Sequence[str], source: str) -> Figure:
    """ "lo-hi" (or one value) of `values`, as read from `source`."""
    return spans([(source, values)])


def spans(found: Iterable[tuple[str, Sequence[str]]]) -> Figure:
    """ "lo-hi" (or one value) of the values read from several files, (file, values)
    each; cited by every file."""
    pairs = [(value, source) for source, values in found for value in values]
    if not pairs:
        raise ValueError("no values")
    low = min(pairs, key=lambda pair: float(pair[0]))[0]
    high = max(pairs, key=lambda pair: float(pair[0]))[0]
    sources = tuple(dict.fromkeys(source for _, source in pairs))
    if float(low) == float(high):
        return Figure(low, sources, (low,))
    return Figure(f"{low}-{high}", sources, (low, high))


def column_span(reports: Iterable[tuple[str, Iterable[str]]], arm: str, name: str) -> Figure:
    """The span of column `name` of `arm`'s rows over the tables of several reports,
    (file, table titles) each."""
    return spans([(source, column(source, list(tables), arm, name)) for source, tables in reports])


def quote(source: str, pattern: str, group: int | str = 0) -> Figure:
    """The text `pattern` matches in `source` (its group `group`)."""
    match = re.search(pattern, read(source))
    if match is None:
        raise EvidenceError(f"{source} no longer says {pattern!r}")
    text = match.group(group)
    return Figure(text, (source,), tuple(re.findall(r"\d+(?:\.\d+)?", text)))


_SUMMARY = re.compile(r"^=+ (?P<counts>\d+ \w+(?:, \d+ \w+)*) in [\d.]+s\b.* =+$", re.M)


def pytest_counts(source: str, section: str | None = None) -> list[dict[str, int]]:
    """The closing counts of each pytest session in a log ({"passed": 8, "skipped": 9}),
    in order; only those after the line `=== {section}` and before the next `=== `
    line, where `section` is given (a log of several runs, one per design)."""
    text = read(source)
    if section is not None:
        parts = re.split(r"^=== (\S+)\n", text, flags=re.M)
        named = dict(zip(parts[1::2], parts[2::2], strict=True))
        if section not in named:
            raise EvidenceError(f"{source} has no section === {section}")
        text = named[section]
    sessions = []
    for match in _SUMMARY.finditer(text):
        counts = {}
        for item in match["counts"].split(", "):
            count, what = item.split(" ")
            counts[what] = int(count)
        sessions.append(counts)
    if not sessions:
        raise EvidenceError(f"{source} has no pytest summary line")
    return sessions


def count(source: str, what: str, section: str | None = None) -> Figure:
    """`what` ("passed", "skipped") of a log's pytest sessions: of its one session, or
    added up over several (the log's numbers are each session's)."""
    sessions = [session.get(what, 0) for session in pytest_counts(source, section)]
    return Figure(str(sum(sessions)), (source,), tuple(str(n) for n in sessions))
