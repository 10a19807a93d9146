"""bench/engine/offsets.py: the differences it reports, and the committed table it made."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import offsets

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "bench/results/engine-offsets-20261203.md"


def _record(**medians_us: float) -> dict:
    arms = {
        arm.replace("_", "-"): [{"replay_s": us * 1e-6}, {"replay_s": us * 1e-6, "ok": False}]
        for arm, us in medians_us.items()
    }
    return {"runners": {"v2": {"samples": {"1": arms}}}}


def _table(text: str, header: str) -> str:
    """The markdown table of text that starts with header, through its last row."""
    rows = text[text.index(header) :].split("\n\n")[0]
    return rows.rstrip("\n") + "\n"


def test_each_pair_is_the_difference_of_the_arms_medians() -> None:
    record = _record(stock=2157, floor=2084, floor_rng=2079, reset=2090)
    [(runner, bs, diffs)] = offsets.rows(record)
    assert (runner, bs) == ("v2", "1")
    assert diffs["floor - floor-rng"] == pytest.approx(5)  # the floor slower: an offset
    assert diffs["reset - floor-rng"] == pytest.approx(11)
    assert diffs["reset - floor"] == pytest.approx(6)
    assert diffs["stock-again - stock"] is None  # no second stock engine in this record


def test_mixed_records_are_read_by_their_forward_gpu_time() -> None:
    record = {
        "runners": {"v1": {"samples": {"1": {"floor": [{"replay_s": 1.0, "forward_gpu_s": 2e-3}]}}}}
    }
    assert offsets.metric(record) == "forward_gpu_s"
    assert offsets.metric(_record(floor=1.0)) == "replay_s"


def test_the_committed_table_is_what_the_records_give() -> None:
    """The table of bench/results/engine-offsets-20261203.md, made again from the
    committed records its rows name."""
    table = _table(COMMITTED.read_text(), "| record | metric |")
    stems = dict.fromkeys(
        line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()[2:]
    )
    assert len(stems) == 8, stems  # every timing record committed on 2026-12-03
    records = [ROOT / "bench/results" / f"{stem}.timing.json" for stem in stems]
    assert table == offsets.markdown(records)


def test_the_committed_engine_starts_are_what_the_records_give() -> None:
    table = _table(COMMITTED.read_text(), "| record | runner | mode | engine starts (s) |")
    stems = dict.fromkeys(
        line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()[2:]
    )
    records = [ROOT / "bench/results" / f"{stem}.identity.json" for stem in stems]
    assert len(records) == 2 and table == offsets.starts_markdown(records)
    assert "| v1 | FULL_AND_PIECEWISE | control-one-seed 30.6, reset 31.2," in table
