"""The patched vLLM engine against stock, value by value, on a GPU (vLLM 0.26.0;
0.20.0 on V1 alone, its V2 runner refusing hybrid models).

Each arm (bench/engine/arms.py), model runner, CUDA-graph mode (identity.MODES) and
serving configuration run (arms.SERVINGS) gets one engine, which serves stock's
workload (bench/engine/worker.py's identity: 12 requests of 5-700 prompt tokens
arriving over the run, temperature 1, LLM(seed=0)) and must give, step by step,
stock's fp16 SSM state in every Mamba-2 layer and, at the end, stock's state
bytes, token ids and logprobs, on every TP rank.  The controls:
- positive: "stock-again", stock in another process, must agree, or the cell is
  skipped as inconclusive (test_stock_is_reproducible fails; compiled cells agree
  only with deterministic kernels: arms.IDENTITY_ENV, arms.compilation_config);
- negative: one seed in every 40 XOR 1, and another generator seed, must differ
  on every rank;
- each serving configuration's options must show in stock's record (prefix-cache
  hits, MTP drafts), and none where they are off.

Run on the GPU machine by tests/gpu/vllm/engine.sh, which stages the copies and
sets SR_ENGINE_SITES; records go to $OUT/engine/identity.json.  With
SR_ENGINE_RECORDS naming such a file, or a committed
bench/results/engine-*.identity.json, the same verdicts are judged from its
records on any machine (cells it lacks skip), in report.py's compact form.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bench.engine import model
from bench.engine.arms import (
    ARMS,
    CONTROLS,
    RETIRED_ARMS,
    SERVINGS,
    STOCK,
    STOCK_AGAIN,
    GraphMode,
    Perturb,
    Runner,
    Serving,
)
from bench.engine.compact import first_difference
from bench.engine.envs import RECORDS_ENV
from bench.engine.identity import MODES, run
from bench.engine.session import (
    IDENTITY_ARMS_ENV,
    MODES_ENV,
    RUNNERS_ENV,
    SERVING_ENV,
    SKIP_REASON,
    Settings,
)
from bench.engine.verdicts import (
    assert_identical,
    cell_id,
    cell_record,
    differing_ranks,
    ranks_of,
    saved_records,
)
from bench.engine.worker import SHARED_PREFIX_REQUESTS

SAVED = os.environ.get(RECORDS_ENV)
pytestmark = [] if SAVED else [pytest.mark.gpu]

PATCHED = [arm.name for arm in ARMS if arm not in (STOCK, STOCK_AGAIN)]
PATCHED += list(RETIRED_ARMS)
# (mode, serving) of every cell; PLAIN's ids are the mode alone, as before the servings.
CELLS = [(mode, serving) for serving in SERVINGS for mode in MODES]


@pytest.fixture(scope="module")
def identity() -> dict[str, Any]:
    if SAVED:
        return saved_records(Path(SAVED))
    settings = Settings.from_env()
    if settings is None:
        pytest.skip(SKIP_REASON)
    return run(settings)


# A cell's record (identity, arm, runner, mode[, serving]); the variables name the run's cells.
record = partial(
    cell_record, selected_by=f"{IDENTITY_ARMS_ENV}, {MODES_ENV}, {SERVING_ENV}, {RUNNERS_ENV}"
)


def judged_stock(
    identity: dict[str, Any], runner: Runner, mode: GraphMode, serving: Serving
) -> dict:
    """Stock's record of a cell where the check means something: where a second
    stock process computed the same bits.  Where it did not, a difference says
    nothing about the seeds, nor an agreement: the cell is skipped, and
    test_stock_is_reproducible fails for it."""
    stock = record(identity, STOCK.name, runner, mode, serving)
    again = record(identity, STOCK_AGAIN.name, runner, mode, serving)
    differ = differing_ranks(stock, again)
    if differ:
        pytest.skip(
            f"inconclusive: two stock processes differ in this cell (rank: from engine "
            f"step) {differ} (test_stock_is_reproducible fails for it)"
        )
    return stock


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
@pytest.mark.parametrize("runner", list(Runner), ids=lambda r: r.value)
def test_stock_is_reproducible(identity, runner: Runner, cell) -> None:
    """The positive control: stock in another process computes the same bits."""
    stock = record(identity, STOCK.name, runner, *cell)
    assert_identical(stock, record(identity, STOCK_AGAIN.name, runner, *cell))


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
@pytest.mark.parametrize("runner", list(Runner), ids=lambda r: r.value)
def test_stock_is_not_degenerate(identity, runner: Runner, cell) -> None:
    """Agreement must not be trivial: engines that all sample from NaN logits,
    or fall into one token, agree too (the identity run fills new allocations
    with NaN: arms.IDENTITY_ENV)."""
    sanity = record(identity, STOCK.name, runner, *cell).get("sanity")
    if sanity is None:
        pytest.skip("records of a run before the sanity figures")
    assert sanity["finite_logprobs"], "a sampled token's logprob is not finite"
    assert sanity["fewest_distinct_tokens"] > 1, "a request sampled one token id only"


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
@pytest.mark.parametrize("runner", list(Runner), ids=lambda r: r.value)
@pytest.mark.parametrize("arm", PATCHED)
def test_identical_to_stock(identity, arm: str, runner: Runner, cell) -> None:
    stock = judged_stock(identity, runner, *cell)
    assert_identical(stock, record(identity, arm, runner, *cell))


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
@pytest.mark.parametrize("runner", list(Runner), ids=lambda r: r.value)
@pytest.mark.parametrize("control", CONTROLS, ids=lambda a: a.name)
def test_negative_control_differs(identity, control, runner: Runner, cell) -> None:
    """The check above can fail: a perturbed stock does not pass it."""
    stock = judged_stock(identity, runner, *cell)
    got = record(identity, control.name, runner, *cell)
    for rank, a, b in ranks_of(stock, got):
        step = first_difference(a["fingerprints"], b["fingerprints"])
        assert step is not None, f"rank {rank}: the state does not differ"
        assert b["state_sha256"] != a["state_sha256"], f"rank {rank}"
        if control.perturb is Perturb.ONE_SEED:
            # Equal until the seeds matter: the state parts at the first step with
            # decodes (outputs show a step late under async scheduling).
            first_decode = stock["decoded"].index(True)
            assert step in (first_decode - 1, first_decode), (rank, step, first_decode)
    if control.perturb is not Perturb.ONE_SEED:
        assert got["tokens_sha256"] != stock["tokens_sha256"]


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
@pytest.mark.parametrize("runner", list(Runner), ids=lambda r: r.value)
def test_serving_options_took_effect(identity, runner: Runner, cell) -> None:
    """Stock's record shows its serving options at work, and only those: under
    prefix caching each later request of SHARED_PREFIX_REQUESTS found at least
    a block of its prompt in the cache, and vLLM counted the hits; with MTP,
    vLLM counted drafts of up to K tokens; with an option off, none of that (the
    controls: a check of the hits or drafts alone could pass on any record)."""
    mode, serving = cell
    stock = record(identity, STOCK.name, runner, mode, serving)
    if "cached_tokens" not in stock:
        pytest.skip("records of a run before the serving configurations")
    cached = stock["cached_tokens"]
    counters = stock.get("counters", {})
    later = [f"r{i}" for i in SHARED_PREFIX_REQUESTS[1:]]
    if serving.prefix_caching:
        assert all(cached[rid] >= stock["block_size"] for rid in later), (
            cached,
            stock["block_size"],
        )
        assert counters.get("vllm:prefix_cache_hits", 0) > 0, counters
    else:
        assert not any(cached.values()), cached
        assert not counters.get("vllm:prefix_cache_hits"), counters
    drafts = counters.get("vllm:spec_decode_num_drafts", 0)
    if serving.speculative_tokens:
        assert drafts > 0, counters
        # Up to K tokens a draft (fewer where a request nears its end), more than one.
        draft_tokens = counters["vllm:spec_decode_num_draft_tokens"]
        assert drafts < draft_tokens <= drafts * serving.speculative_tokens, counters
    else:
        assert not drafts, counters


@pytest.mark.parametrize("runner", list(Runner), ids=lambda r: r.value)
def test_engagement_line(identity, runner: Runner) -> None:
    """The engine log names the backend and N (the forward-context design its name
    too); off, it says nothing."""
    lines = {
        name: identity["engagement"][f"{name}/{runner.value}"]
        for name in (*(arm.name for arm in ARMS), *RETIRED_ARMS)
        if f"{name}/{runner.value}" in identity["engagement"]  # a run of some arms
    }
    if not lines:
        pytest.skip(f"no engine of {runner.value} ran ({RUNNERS_ENV})")
    n = model.mamba2_layers()
    # vLLM's copy has one drawer, so its line names the backend only (records made
    # before 2026-12-02 name the design too); the variant arms swap runner_hooks'
    # prefetcher in behind the same line, and the retired arms' records did too.
    reset = ("flashinfer SSU",)
    expected = {
        "reset": reset,
        "reset-single": reset,
        "reset-randint": reset,
        "reset-outside-graph": reset,
        "reset-checked-once": reset,
        "forward-context": ("forward-context design", "flashinfer SSU"),
    }
    assert set(expected) == set(PATCHED) - {"flag-off"}
    for arm, words in expected.items():
        if arm not in lines:
            continue  # a run without that arm (SR_ENGINE_IDENTITY_ARMS, or before it)
        joined = " | ".join(lines[arm])
        assert f"seeds for {n} layers per forward" in joined, (arm, joined)
        assert all(word in joined for word in words), (arm, joined)
    off = [arm for arm in ("stock", "stock-again", "flag-off") if arm in lines]
    assert off and all(lines[arm] == [] for arm in off), lines
