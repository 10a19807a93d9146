"""bench/engine/compact.py: the committed form of engine records, and the converter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from . import compact, report
from .test_judge import _tp2_records, judged

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
JUDGED_LIMIT = 100 * 1024
RESULTS_LIMIT = 3 * 1024 * 1024
"""bench/results in all: the records of every run its index still reads (2.3 MB with
2026-12-04's runs, kernel names cut: compact.kernel_name); a run that would pass it
drops a superseded run's records first."""


def _without_slot_sums(data: dict) -> dict:
    data = json.loads(json.dumps(data))
    for runs in data["records"].values():
        for record in runs:
            for state in compact._states(record):
                state.pop("slot_sums", None)
    return data


def _raw_run() -> dict:
    """A run's identity.json as main's harness writes it (arms of their old names),
    with per-slot sums and per-layer sums of the first steps."""
    run = _tp2_records({"control-one-seed": {0: 1, 1: 1}, "control-generator-seed": {0: 0, 1: 0}})
    records = {}
    for cell, record in run["records"].items():
        arm = cell.split("/")[0]
        if arm in ("reset", "reset-single"):  # the names main's harness gives them
            cell = cell.replace(
                arm, {"reset": "reset-kernel", "reset-single": "reset-kernel-single"}[arm], 1
            )
        for state in record["ranks"]:
            parted = arm.startswith("control")
            state["layer_sums"] = [[f"{state['fingerprints'][i][:16]}"] * 4 for i in range(3)]
            state["slot_sums"] = [
                ["0" * 8, ("f" if parted and i else "1") * 8, "0" * 8] for i in range(3)
            ]
            state["rng_offsets"] = [0, 4, 8, 12]
        records[cell] = record
    run["records"] = records
    run["engagement"] = {"reset-kernel/v1": ["a line"], "stock/v1": []}
    run["tp"] = 2
    return run


def test_the_committed_form_keeps_every_verdict_and_renames_old_arms() -> None:
    raw = _raw_run()
    text = compact.dumps_identity(compact.packed(raw))
    back = compact.unpacked(json.loads(text))
    plain = compact.unpacked(raw)
    assert _without_slot_sums(back) == _without_slot_sums(plain)
    assert report.identity_markdown(back["records"]) == report.identity_markdown(plain["records"])
    assert "slots 1" in report.identity_markdown(back["records"])  # the controls' slot
    assert "reset/v1/eager" in back["records"] and "reset-kernel/v1/eager" not in back["records"]
    assert back["engagement"] == {"reset/v1": ["a line"], "stock/v1": []} and back["tp"] == 2
    # Each chain once; per-slot sums only on the states that part from stock, and stock's.
    data = json.loads(text)
    assert data["format"] == compact.FORMAT
    distinct = {
        json.dumps(state["fingerprints"])
        for runs in plain["records"].values()
        for record in runs
        for state in record["ranks"]
    }
    assert (
        len(data["chains"])
        == len(distinct)
        < sum(len(record["ranks"]) for runs in data["records"].values() for record in runs)
    )
    with_sums = {
        cell.split("/")[0]
        for cell, runs in data["records"].items()
        for record in runs
        for state in record["ranks"]
        if "slot_sums" in state
    }
    assert with_sums == {"stock", "control-one-seed", "control-generator-seed"}
    # Run again on its own output, the converter writes the same bytes.
    assert compact.converted(text) == text


def test_a_converted_run_is_judged_as_the_run_itself(tmp_path: Path) -> None:
    """The judge's verdicts on a run's identity.json of main's harness (old arm names)
    and on the file the converter makes of it are the same, arms renamed."""
    raw, converted = tmp_path / "identity.json", tmp_path / "converted.identity.json"
    raw.write_text(json.dumps(_raw_run()))
    converted.write_text(json.dumps(_raw_run()))
    done = subprocess.run(
        [sys.executable, "-m", "bench.engine.compact", str(converted)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "bytes" in done.stdout
    again = subprocess.run(
        [sys.executable, "-m", "bench.engine.compact", str(converted)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "already in the committed form" in again.stdout
    selection = ("-k", "v1-eager and not reset-randint and not forward-context")
    (before, _), (after, output) = judged(raw, *selection), judged(converted, *selection)
    assert before == after and "test_identical_to_stock[reset-v1-eager]" in after, output[-3000:]
    assert set(after.values()) == {"PASSED"}, output[-3000:]


def test_other_records_keep_their_content_one_entry_a_line(tmp_path: Path) -> None:
    timing = {"runners": {"v1": {"summary": {"replay": {"1": {"reset-kernel": {"n": 1}}}}}}}
    text = compact.converted(json.dumps(timing))
    assert json.loads(text) == {
        "runners": {"v1": {"summary": {"replay": {"1": {"reset": {"n": 1}}}}}}
    }
    rows = [{"variant": "explicit-current_stream-kernel", "ties": ["baseline"]}]
    assert json.loads(compact.converted(json.dumps(rows))) == [
        {"variant": "reset-current_stream-kernel", "ties": ["forward-context"]}
    ]
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert compact.main([str(bad)]) == 1


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_the_committed_records_are_in_the_committed_form(path: Path) -> None:
    text = path.read_text()
    try:
        kind = compact.kind(json.loads(text))
    except ValueError:
        pytest.skip("not an engine record or summary (flag_off.py's)")
    assert compact.converted(text) == text, f"python -m bench.engine.compact {path}"
    if kind == "identity":
        assert len(text.encode()) < JUDGED_LIMIT


def test_the_results_stay_small() -> None:
    total = sum(path.stat().st_size for path in RESULTS.iterdir() if path.is_file())
    assert total < RESULTS_LIMIT, total


def test_a_timing_profile_names_kernels_without_their_parameters() -> None:
    """The committed form cuts each profiled kernel's parameter list; kernels that then
    share a name are one entry, launches and µs summed; a second pass changes nothing."""
    kernels = [
        ["void f<int>(int*, float)", 40.0, 80.0],
        ["void f<int>(int*, double)", 2.0, 1.5],
        ["Memcpy DtoD (Device -> Device)", 1.0, 0.5],
        ["triton_poi_fused_1", 40.0, 50.25],
    ]
    record = {"runners": {"v1": {"profile": {"stock": {"1": {"kernels": kernels}}}}}}
    text = compact.converted(json.dumps(record))
    assert json.loads(text)["runners"]["v1"]["profile"]["stock"]["1"]["kernels"] == [
        ["void f<int>", 42.0, 81.5],
        ["Memcpy DtoD (Device -> Device)", 1.0, 0.5],
        ["triton_poi_fused_1", 40.0, 50.25],
    ]
    assert compact.converted(text) == text
