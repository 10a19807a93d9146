"""The summary's arithmetic and files, from made-up samples."""

from __future__ import annotations

import json

import pytest

from .summary import (
    FAILED,
    OK,
    SKIPPED,
    Cell,
    RunInfo,
    gpu_slug,
    markdown,
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


def cells() -> list[Cell]:
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


def test_recovered_share():
    assert recovered_share(232.0, 232.0, 155.0) == 0.0
    assert recovered_share(155.0, 232.0, 155.0) == 1.0
    assert recovered_share(193.5, 232.0, 155.0) == pytest.approx(0.5)
    assert recovered_share(240.0, 232.0, 155.0) < 0
    assert recovered_share(150.0, 150.0, 150.0) is None
    assert recovered_share(150.0, 140.0, 150.0) is None


def test_rows_compare_within_mode_and_batch_size():
    rows = {(row.variant, row.mode): row for row in summarize(cells())}
    stock, ours, floor = (rows[name, "graph"] for name in ("stock", "ours", "floor"))
    assert stock.median_us == 232.0 and stock.ratio_to_stock == 1.0 and stock.recovered == 0.0
    assert ours.median_us == 175.0
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


def test_json_rows_have_the_documented_keys(tmp_path):
    json_path, md_path = write_summary(summarize(cells()), INFO, tmp_path)
    assert json_path == tmp_path / "nvidia-h200-20261129.summary.json"
    assert md_path == tmp_path / "nvidia-h200-20261129.md"
    rows = json.loads(json_path.read_text())
    assert isinstance(rows, list) and len(rows) == len(cells())
    for row in rows:
        assert {"variant", "mode", "batch_size", "median_us", "ratio_to_stock", "recovered"} <= set(
            row
        )
    ours = next(row for row in rows if row["variant"] == "ours" and row["mode"] == "graph")
    assert ours["median_us"] == 175.0 and ours["recovered"] == round(57 / 77, 4)
    assert ours["status"] == OK and ours["reason"] is None


def test_markdown_shows_tables_command_and_why_variants_are_missing():
    text = markdown(summarize(cells()), INFO)
    assert "# SSU seed step time: NVIDIA H200, 2026-11-29" in text
    assert "`pytest bench --benchmark-only`" in text
    assert "| ours | 175.0 (0.754x, rec 0.74) |" in text
    assert "| stock | 1205 |" in text
    assert "- kernel: skipped: nvcc missing" in text
    assert "- wrong: failed: 3 of 120 seeds differ" in text
    graph_at = text.index("## CUDA-graph replay")
    assert graph_at < text.index("## Eager: µs per step") < text.index("## Eager: host")


def test_file_names():
    assert gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert gpu_slug("NVIDIA GeForce RTX 4090 (laptop)") == "nvidia-geforce-rtx-4090-laptop"
    assert gpu_slug("???") == "gpu"
    tagged = RunInfo(gpu="NVIDIA H200", date="20261129", command="", tag="gemms")
    assert summary_stem(tagged) == "nvidia-h200-20261129-gemms"
