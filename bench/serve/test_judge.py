"""The serve run's identity judge on committed records: every run in COMMITTED_RUNS (and
the file SR_SERVE_RECORDS names, where set) passes every verdict of judge.py, and
holds the cells its write-up quotes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from . import judge
from .envs import RECORDS_ENV

ROOT = Path(__file__).resolve().parents[2]
# Committed serve runs (bench/results/<prefix>.serve.json, written by bench.serve.report
# --prefix), each with the runners whose identity its write-up quotes.
COMMITTED_RUNS: dict[str, tuple[str, ...]] = {"bench/results/serve-nvidia-h200-20261203": ("v1",)}


def _runs() -> list[tuple[str, tuple[str, ...]]]:
    runs = [(f"{prefix}.serve.json", runners) for prefix, runners in sorted(COMMITTED_RUNS.items())]
    if os.environ.get(RECORDS_ENV):
        runs.append((os.environ[RECORDS_ENV], ()))
    return runs


@pytest.mark.parametrize(
    ("records", "runners"),
    _runs()
    or [
        pytest.param(
            None,
            (),
            marks=pytest.mark.skip(
                reason="no serve run committed yet (COMMITTED_RUNS) and SR_SERVE_RECORDS unset"
            ),
        )
    ],
)
def test_committed_serve_identity(records: str, runners: tuple[str, ...]) -> None:
    data = json.loads((ROOT / records).read_text())
    failed = judge.failed(data)
    assert not failed, failed
    names = {name for name, _, _ in judge.verdicts(data)}
    for runner in runners:
        assert any(n.startswith("identical to stock [reset-" + runner) for n in names), runner
        assert any(n.startswith("control differs [control-one-seed-" + runner) for n in names), (
            runner
        )
        assert any(n.startswith("engagement line [reset-" + runner) for n in names), runner
