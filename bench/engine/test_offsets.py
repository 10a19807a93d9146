"""bench/engine/offsets.py: the differences it reports, and the committed table it made."""

from __future__ import annotations

import json
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


KERNELS = ROOT / "bench/results/engine-kernels-20261204.md"


def test_the_kernel_split_puts_the_seed_path_apart_from_the_kernels_launched_alike(
    tmp_path: Path,
) -> None:
    stock = [["randint", 40.0, 80.0], ["gemm", 80.0, 400.0], ["fill", 2.0, 1.5]]
    reset = [["seeds", 1.0, 1.6], ["gemm", 80.0, 409.8], ["fill", 2.0, 1.5]]
    profile = {"stock": {"1": {"kernels": stock}}, "reset": {"1": {"kernels": reset}}}
    path = tmp_path / "case.timing.json"
    path.write_text(json.dumps({"runners": {"v2": {"profile": profile}}}))
    assert offsets.kernels_markdown([path]).splitlines()[2] == (
        "| case | v2 | 1 | reset | -78.4 | +9.8 | `gemm` +9.8 |"
    )


def test_the_committed_kernel_table_is_what_the_records_give() -> None:
    """The table of bench/results/engine-kernels-20261204.md, made again from every
    committed record that keeps profiles."""
    table = _table(KERNELS.read_text(), "| record | runner | BS | arm |")
    stems = dict.fromkeys(
        line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()[2:]
    )
    assert len(stems) == 4, stems
    records = sorted(ROOT / "bench/results" / f"{stem}.timing.json" for stem in stems)
    assert table == offsets.kernels_markdown(records)
    with_profiles = [
        path
        for path in sorted((ROOT / "bench/results").glob("*.timing.json"))
        if '"profile"' in path.read_text()
    ]
    assert records == with_profiles


def test_the_rng_path_counts_each_kind_of_seed_kernel(tmp_path: Path) -> None:
    stock = [
        ["distribution_elementwise_grid_stride_kernel<random_from_to_kernel>", 40.0, 80.0],
        ["vectorized_elementwise_kernel<2, FillFunctor<long>>", 2.0, 1.5],
        ["gemm", 80.0, 400.0],
    ]
    outside = [["(anonymous namespace)::stock_seeds_kernel", 1.0, 0.8], ["gemm", 80.0, 401.0]]
    profile = {
        "stock": {"1": {"kernels": stock}},
        "reset-outside-graph": {"1": {"kernels": outside}},
    }
    path = tmp_path / "case.timing.json"
    path.write_text(json.dumps({"runners": {"v2": {"profile": profile}}}))
    assert offsets.rng_path_markdown([path]).splitlines()[2:] == [
        "| case | v2 | 1 | reset-outside-graph | 81 | - | - | 1, 0.8 |",
        "| case | v2 | 1 | stock | 122 | 40, 80.0 | 2, 1.5 | - |",
    ]


def test_the_committed_rng_path_table_is_what_the_records_give() -> None:
    """The seed path's table of bench/results/engine-kernels-20261204.md, made again from
    the same records as its kernel split."""
    table = _table(KERNELS.read_text(), "| record | runner | BS | arm | kernels per step |")
    stems = dict.fromkeys(
        line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()[2:]
    )
    records = sorted(ROOT / "bench/results" / f"{stem}.timing.json" for stem in stems)
    assert len(records) == 4 and table == offsets.rng_path_markdown(records)


def test_a_bad_record_is_answered_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match=r"^offsets: a record is not of the form timing"):
        offsets.main(["--rng-path", str(bad)])
    with pytest.raises(SystemExit, match=r"^offsets: .*No such file"):
        offsets.main(["--kernels", str(tmp_path / "missing.json")])
    bad.write_text("not json")
    with pytest.raises(SystemExit, match=r"^offsets: Expecting value"):
        offsets.main([str(bad)])
