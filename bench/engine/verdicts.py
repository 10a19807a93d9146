"""An engine's identity record against stock's, value by value, a run's saved
records read back, and one cell's record looked up: what
tests/gpu/vllm/test_engine_identity.py and tests/gpu/test_plugin_engine.py share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from . import compact
from .arms import PLAIN, GraphMode, Runner, Serving
from .compact import compact_record, first_difference, rank_states
from .identity import key

MIN_DECODE_STEPS = 64
"""Fewer decode steps in stock's record than this and the identity shows too little."""


def ranks_of(stock: dict, got: dict) -> list[tuple[int, dict, dict]]:
    """(rank, stock's state, got's state) for every TP rank, both records having
    the same ranks."""
    mine, theirs = rank_states(stock), rank_states(got)
    assert [s["rank"] for s in theirs] == [s["rank"] for s in mine], "not the same TP ranks"
    return [(a["rank"], a, b) for a, b in zip(mine, theirs, strict=True)]


def differing_ranks(stock: dict, got: dict) -> dict[int, int | None]:
    """rank -> the first engine step its SSM state differs from stock's (None:
    only the final bytes do), for every rank whose state differs."""
    differ = {}
    for rank, a, b in ranks_of(stock, got):
        step = first_difference(a["fingerprints"], b["fingerprints"])
        if step is not None or a["state_sha256"] != b["state_sha256"]:
            differ[rank] = step
    return differ


def assert_identical(stock: dict, got: dict) -> None:
    assert stock["decode_steps"] >= MIN_DECODE_STEPS, stock["decode_steps"]
    differ = differing_ranks(stock, got)
    assert not differ, f"the SSM state differs from stock's (rank: from engine step) {differ}"
    assert got["tokens_sha256"] == stock["tokens_sha256"], "token ids differ"
    assert got["logprobs_sha256"] == stock["logprobs_sha256"], "logprobs differ"
    for name in ("cached_tokens", "counters"):  # records of runs with the servings
        assert got.get(name) == stock.get(name), f"{name} differ"


def saved_records(path: Path) -> dict[str, Any]:
    """A run's records from its identity.json or its committed file, of any form
    bench/engine/compact.py reads (the last run of a cell where the file merges
    several; arms under their current names)."""
    data = compact.load(path)
    return {
        "records": {cell: runs[-1] for cell, runs in data["records"].items()},
        "engagement": data["engagement"],
        "saved": str(path),
    }


def cell_id(cell: tuple[GraphMode, Serving]) -> str:
    """A (mode, serving) cell's test id: PLAIN's is the mode alone, as before the servings."""
    mode, serving = cell
    return mode.value if serving == PLAIN else f"{mode.value}-{serving.name}"


def cell_record(
    identity: dict[str, Any],
    arm: str,
    runner: Runner,
    mode: GraphMode,
    serving: Serving = PLAIN,
    *,
    selected_by: str,
) -> dict:
    """One cell's record, compact, from a run's records (identity.run) or saved ones
    (saved_records).  Skips where the cell is absent (selected_by: the variables that
    choose a run's cells), fails where its engine did not run; a run's own records
    hold one state from every TP rank."""
    cell = key(arm, runner, mode, serving)
    if cell not in identity["records"]:
        if "saved" in identity:
            pytest.skip(f"{cell} is not in {identity['saved']} (a run without that cell)")
        pytest.skip(f"{cell} was not run ({selected_by})")
    got = identity["records"][cell]
    if "error" in got:
        pytest.fail(f"{cell} did not run: {got['error']}", pytrace=False)
    got = got if "tokens_sha256" in got else compact_record(got)
    if "tp" in identity:
        ranks = [state["rank"] for state in rank_states(got)]
        assert ranks == list(range(identity["tp"])), f"{cell}: states of ranks {ranks}"
    return got
