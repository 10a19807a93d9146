"""The summary's arithmetic, intervals, ties and files, from made-up samples."""

from __future__ import annotations

import json
import random

import pytest

from .stats import MIN_SAMPLES
from .summary import (
    FAILED,
    OK,
    SKIPPED,
    Cell,
    RunInfo,
    fastest,
    gpu_slug,
    markdown,
    ratio_to_stock,
    recovered_share,
    summarize,
    summary_stem,
    write_summary,
)

INFO = RunInfo(
    gpu="NVIDIA H200",
    date="20261129",
    command="pytest bench --benchmark-only",
    settings=("torch 2.11",),
)
RESAMPLES = 200
"""Fewer than the bench's 2000: enough for the tests, and fast."""


def few_cells() -> list[Cell]:
    """Too few rounds for intervals."""
    return [
        Cell("stock", "graph", 1, step_us=(230.0, 232.0, 250.0), host_us=()),
        Cell("ours", "graph", 1, step_us=(170.0, 180.0, 175.0)),
        Cell("floor", "graph", 1, step_us=(155.0, 155.0, 155.0)),
        Cell("stock", "eager", 1, step_us=(1300.0,), host_us=(1200.0, 1210.0)),
        Cell("ours", "eager", 1, step_us=(1400.0,), host_us=(1300.0,)),
        Cell("floor", "eager", 1, step_us=(900.0,), host_us=(800.0,)),
        Cell("kernel", "graph", 1, status=SKIPPED, reason="nvcc missing"),
        Cell("wrong", "graph", 1, status=FAILED, reason="3 of 120 seeds differ"),
    ]


def rounds_of(centre: float, drift: list[float], noise: float, rng: random.Random):
    return tuple(centre + shift + rng.gauss(0, noise) for shift in drift)


def many_cells(rounds: int = 40) -> list[Cell]:
    """Graph and eager at BS1 and BS2: ours and close tie; far is clearly slower than ours."""
    rng = random.Random(11)
    cells = []
    for batch_size in (1, 2):
        for mode in ("graph", "eager"):
            drift = [rng.gauss(0, 1.0) for _ in range(rounds)]
            host = mode == "eager"
            for name, centre in (
                ("stock", 230.0),
                ("ours", 175.0),
                ("close", 175.3),
                ("far", 200.0),
                ("floor-rng", 165.0),
                ("floor", 160.0),
            ):
                cells.append(
                    Cell(
                        name,
                        mode,
                        batch_size,
                        step_us=rounds_of(centre, drift, 1.0, rng),
                        host_us=rounds_of(centre * 5, drift, 20.0, rng) if host else (),
                    )
                )
    return cells


def test_recovered_share_and_ratio():
    assert recovered_share(232.0, 232.0, 155.0) == 0.0
    assert recovered_share(155.0, 232.0, 155.0) == 1.0
    assert recovered_share(193.5, 232.0, 155.0) == pytest.approx(0.5)
    assert recovered_share(240.0, 232.0, 155.0) < 0
    assert recovered_share(150.0, 150.0, 150.0) is None
    assert recovered_share(150.0, 140.0, 150.0) is None
    assert ratio_to_stock(175.0, 250.0) == 0.7
    assert ratio_to_stock(175.0, 0.0) is None


def test_rows_compare_within_mode_and_batch_size():
    rows = {(row.variant, row.mode): row for row in summarize(few_cells())}
    stock, ours, floor = (rows[name, "graph"] for name in ("stock", "ours", "floor"))
    assert stock.median_us == 232.0 and stock.ratio_to_stock == 1.0 and stock.recovered == 0.0
    assert ours.median_us == 175.0 and ours.samples == 3
    assert ours.ratio_to_stock == pytest.approx(175 / 232)
    assert ours.recovered == pytest.approx((232 - 175) / (232 - 155))
    assert floor.recovered == 1.0
    eager = rows["ours", "eager"]
    assert eager.ratio_to_stock == pytest.approx(1400 / 1300)
    assert eager.recovered == pytest.approx((1300 - 1400) / (1300 - 900))
    assert eager.host_us == 1300.0 and rows["stock", "eager"].host_us == 1205.0
    skipped = rows["kernel", "graph"]
    assert (skipped.median_us, skipped.ratio_to_stock, skipped.recovered) == (None, None, None)
    assert skipped.status == SKIPPED and skipped.reason == "nvcc missing"


def test_too_few_rounds_give_quartiles_but_no_intervals_or_ties():
    assert len(few_cells()[0].step_us) < MIN_SAMPLES
    ours = next(
        row for row in summarize(few_cells()) if (row.variant, row.mode) == ("ours", "graph")
    )
    assert ours.quartiles_us == (172.5, 177.5) and ours.iqr_us == 5.0
    assert (ours.median_ci95_us, ours.ratio_ci95, ours.recovered_ci95) == (None, None, None)
    assert ours.ties == ()
    text = markdown(summarize(few_cells()), INFO)
    assert "| ours | 175.0 | n/a | 5.0 | 0.754 n/a | 0.74 n/a | - | n/a |" in text
    assert "Fastest seed path by median: ours, 175.0 µs; no intervals" in text


def test_intervals_hold_their_figures_and_pair_the_rounds():
    rows = summarize(many_cells(), resamples=RESAMPLES)
    for row in rows:
        low, high = row.median_ci95_us
        assert low <= row.median_us <= high
        assert row.ratio_ci95[0] <= row.ratio_to_stock <= row.ratio_ci95[1]
        assert row.recovered_ci95[0] <= row.recovered <= row.recovered_ci95[1]
        assert row.quartiles_us[0] <= row.median_us <= row.quartiles_us[1]
        if row.mode == "eager":
            assert row.host_ci95_us[0] <= row.host_us <= row.host_ci95_us[1]
            assert row.host_iqr_us > 0
        else:
            assert row.host_us is row.host_ci95_us is row.host_iqr_us is None
    by_key = {(row.variant, row.mode, row.batch_size): row for row in rows}
    stock = by_key["stock", "graph", 1]
    assert stock.ratio_ci95 == (1.0, 1.0) and stock.recovered_ci95 == (0.0, 0.0)
    assert by_key["floor", "graph", 1].recovered_ci95 == (1.0, 1.0)


def test_the_drawing_floor_is_a_second_reference_and_no_contender():
    rows = summarize(many_cells(), resamples=RESAMPLES)
    by_key = {(row.variant, row.mode, row.batch_size): row for row in rows}
    ours, drawing = by_key["ours", "graph", 1], by_key["floor-rng", "graph", 1]
    stock = by_key["stock", "graph", 1]
    removable = stock.median_us - drawing.median_us
    assert ours.recovered_vs_drawing_floor == pytest.approx(
        (stock.median_us - ours.median_us) / removable
    )
    assert ours.recovered_vs_drawing_floor > ours.recovered  # a smaller denominator
    low, high = ours.recovered_vs_drawing_floor_ci95
    assert low <= ours.recovered_vs_drawing_floor <= high
    assert drawing.recovered_vs_drawing_floor_ci95 == (1.0, 1.0)
    assert stock.recovered_vs_drawing_floor_ci95 == (0.0, 0.0)
    group = [row for row in rows if (row.mode, row.batch_size) == ("graph", 1)]
    assert fastest(group).variant == "ours"  # not floor-rng, though faster
    text = markdown(rows, INFO, RESAMPLES)
    assert "| recovered vs floor-rng [95% CI] |" in text
    assert f"| floor-rng | {drawing.median_us:.1f} |" in text


def test_ties_are_overlapping_intervals():
    rows = summarize(many_cells(), resamples=RESAMPLES)
    graph = [row for row in rows if (row.mode, row.batch_size) == ("graph", 1)]
    by_name = {row.variant: row for row in graph}
    assert "close" in by_name["ours"].ties and "ours" in by_name["close"].ties
    assert "far" not in by_name["ours"].ties and by_name["far"].ties == ()
    best = fastest(graph)
    assert best is not None and best.variant in ("ours", "close")
    text = markdown(rows, INFO, RESAMPLES)
    assert f"Fastest seed path: **{best.variant}**, {best.median_us:.1f} µs [" in text
    assert "; tie with " in text and "(95% intervals of the medians overlap)." in text


def test_the_floor_is_not_a_contender_and_failures_are_not_either():
    rows = summarize(few_cells())
    assert fastest(rows).variant == "ours"
    assert fastest([row for row in rows if row.status != OK]) is None


def test_figures_are_reproducible_and_each_group_its_own():
    cells = many_cells()
    whole = summarize(cells, resamples=RESAMPLES)
    assert whole == summarize(cells, resamples=RESAMPLES)
    alone = summarize([cell for cell in cells if cell.batch_size == 2], resamples=RESAMPLES)
    assert alone == [row for row in whole if row.batch_size == 2]
    other_seed = summarize(cells, resamples=RESAMPLES, seed=1)
    assert [row.median_us for row in other_seed] == [row.median_us for row in whole]
    assert [row.median_ci95_us for row in other_seed] != [row.median_ci95_us for row in whole]


def test_json_rows_have_the_documented_keys(tmp_path):
    json_path, md_path = write_summary(summarize(few_cells()), INFO, tmp_path)
    assert json_path == tmp_path / "nvidia-h200-20261129.summary.json"
    assert md_path == tmp_path / "nvidia-h200-20261129.md"
    rows = json.loads(json_path.read_text())
    assert isinstance(rows, list) and len(rows) == len(few_cells())
    documented = {
        "variant",
        "mode",
        "batch_size",
        "samples",
        "median_us",
        "median_ci95_us",
        "iqr_us",
        "quartiles_us",
        "ratio_to_stock",
        "ratio_ci95",
        "recovered",
        "recovered_ci95",
        "recovered_vs_drawing_floor",
        "recovered_vs_drawing_floor_ci95",
        "ties",
        "host_us",
        "host_ci95_us",
        "host_iqr_us",
        "status",
        "reason",
    }
    assert all(set(row) == documented for row in rows)
    ours = next(row for row in rows if row["variant"] == "ours" and row["mode"] == "graph")
    assert ours["median_us"] == 175.0 and ours["recovered"] == round(57 / 77, 4)
    assert ours["quartiles_us"] == [172.5, 177.5] and ours["ties"] == []
    assert ours["status"] == OK and ours["reason"] is None


def test_json_intervals_are_rounded_pairs(tmp_path):
    json_path, _ = write_summary(summarize(many_cells(), resamples=RESAMPLES), INFO, tmp_path)
    ours = next(
        row
        for row in json.loads(json_path.read_text())
        if (row["variant"], row["mode"], row["batch_size"]) == ("ours", "eager", 1)
    )
    for key, digits in (("median_ci95_us", 2), ("ratio_ci95", 4), ("host_ci95_us", 2)):
        low, high = ours[key]
        assert low <= high and round(low, digits) == low
    assert "close" in ours["ties"]


def test_markdown_shows_tables_command_and_why_variants_are_missing():
    text = markdown(summarize(few_cells()), INFO)
    assert "# SSU seed step time: NVIDIA H200, 2026-11-29" in text
    assert "`pytest bench --benchmark-only`" in text
    assert "- torch 2.11" in text
    assert "| stock | 1300.0 | n/a | 0.0 | 1.000 | 0.00 | - | n/a | 1205 n/a, IQR 5 |" in text
    assert "| kernel | skipped |" in text and "| wrong | **FAILED** |" in text
    assert "- kernel: skipped: nvcc missing" in text
    assert "- wrong: failed: 3 of 120 seeds differ" in text
    graph_at = text.index("## CUDA-graph replay")
    assert graph_at < text.index("### BS1") < text.index("## Eager: µs per step, and host µs")


def test_markdown_gives_every_median_its_interval_and_iqr():
    rows = summarize(many_cells(), resamples=RESAMPLES)
    text = markdown(rows, INFO, RESAMPLES)
    assert f"{RESAMPLES} resamples of the rounds" in text
    for row in rows:
        low, high = row.median_ci95_us
        line = (
            f"| {row.variant} | {row.median_us:.1f} | [{low:.1f}, {high:.1f}] | {row.iqr_us:.1f} |"
        )
        assert line in text


def test_file_names():
    assert gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert gpu_slug("NVIDIA GeForce RTX 4090 (laptop)") == "nvidia-geforce-rtx-4090-laptop"
    assert gpu_slug("???") == "gpu"
    tagged = RunInfo(gpu="NVIDIA H200", date="20261129", command="", tag="gemms")
    assert summary_stem(tagged) == "nvidia-h200-20261129-gemms"
