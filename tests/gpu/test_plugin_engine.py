"""Stock vLLM with the sr_seed_prefetch plugin engaged against stock, value by value,
on a GPU.

The engines are bench/engine's, run as tests/gpu/vllm/test_engine_identity.py runs them
(identity.run: 12 requests of 5-700 prompt tokens, temperature 1, LLM(seed=0)), with
four arms: stock, stock-again (the positive control: stock in another process), plugin
(arms.PLUGIN: the same stock copy of vLLM, VLLM_MAMBA_SR_SEED_PREFETCH=1, the plugin
loaded by vLLM from this package's entry point) and control-one-seed (stock with one SR
seed in every 40 XOR 1, the negative control); through each runner the release serves
the model with (V1 and V2 from 0.23.0), eager and FULL_AND_PIECEWISE, in each serving
configuration SR_ENGINE_SERVING names (arms.SERVINGS; plain when unset).  Asserted: the
plugin's fp16 SSM state of every Mamba-2 layer at every engine step, and at the end the
state bytes, token ids, logprobs, prefix-cache hits and MTP counters, equal stock's; the
control's state differs; the plugin's engine logs the plugin's line and the prefetcher's
engagement line, stock's neither.

Needs the stock vLLM copy named in $SR_ENGINE_SITES (`stock=/tmp/site`), this package
pip-installed in the engine's Python (its entry point); the command is in
vllm_patch/PLUGIN.md.  Records go to $OUT/engine/identity.json.  With SR_ENGINE_RECORDS
naming such a file, or a committed bench/results/engine-*-plugin*.identity.json, the same
verdicts are judged from its records on any machine (cells it lacks skip; the check of
the site's files needs the GPU run).
"""

from __future__ import annotations

import hashlib
import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bench.engine import model
from bench.engine.arms import (
    CONTROLS,
    PLUGIN,
    SERVINGS,
    STOCK,
    STOCK_AGAIN,
    GraphMode,
    Perturb,
    Runner,
)
from bench.engine.compact import rank_states
from bench.engine.envs import RECORDS_ENV
from bench.engine.identity import run
from bench.engine.session import MODES_ENV, RUNNERS_ENV, SERVING_ENV, SKIP_REASON, Settings
from bench.engine.verdicts import (
    assert_identical,
    cell_id,
    cell_record,
    differing_ranks,
    saved_records,
)
from vllm_patch import plugin, releases, tree

SAVED = os.environ.get(RECORDS_ENV)
pytestmark = [] if SAVED else [pytest.mark.gpu]

CONTROL = next(arm for arm in CONTROLS if arm.perturb is Perturb.ONE_SEED)
MODES = (GraphMode.EAGER, GraphMode.FULL_AND_PIECEWISE)


@pytest.fixture(scope="module")
def identity() -> dict[str, Any]:
    if SAVED:
        return {**saved_records(Path(SAVED)), "site": None}
    settings = Settings.from_env()
    if settings is None:
        pytest.skip(SKIP_REASON)
    if not plugin.entry_point_installed():
        pytest.fail(
            f"this Python has no {plugin.GROUP} entry point {plugin.NAME}: install this "
            "package (pip install --no-deps --no-build-isolation -e .)",
            pytrace=False,
        )
    found = run(settings, arms=(STOCK, STOCK_AGAIN, PLUGIN, CONTROL), modes=MODES)
    return {**found, "site": settings.sites["stock"]}


# A cell's record (identity, arm, runner, mode[, serving]); the variables name the run's cells.
record = partial(cell_record, selected_by=f"{RUNNERS_ENV}, {MODES_ENV}, {SERVING_ENV}")


# (mode, serving) of every cell; SR_ENGINE_SERVING picks the run's servings.
cells = pytest.mark.parametrize(
    "cell", [(mode, serving) for serving in SERVINGS for mode in MODES], ids=cell_id
)
runners = pytest.mark.parametrize("runner", list(Runner), ids=lambda r: r.value)


@cells
@runners
def test_stock_is_reproducible(identity, runner: Runner, cell) -> None:
    stock = record(identity, STOCK.name, runner, *cell)
    assert_identical(stock, record(identity, STOCK_AGAIN.name, runner, *cell))


@cells
@runners
def test_plugin_is_identical_to_stock(identity, runner: Runner, cell) -> None:
    stock = record(identity, STOCK.name, runner, *cell)
    again = record(identity, STOCK_AGAIN.name, runner, *cell)
    if differing_ranks(stock, again):
        pytest.skip("inconclusive: two stock processes differ (test_stock_is_reproducible)")
    assert_identical(stock, record(identity, PLUGIN.name, runner, *cell))


@cells
@runners
def test_negative_control_differs(identity, runner: Runner, cell) -> None:
    stock = record(identity, STOCK.name, runner, *cell)
    got = record(identity, CONTROL.name, runner, *cell)
    differ = differing_ranks(stock, got)
    assert sorted(differ) == [s["rank"] for s in rank_states(stock)], differ
    assert all(step is not None for step in differ.values()), differ


@runners
def test_plugin_engaged(identity, runner: Runner) -> None:
    """The plugin's engine logs the plugin's line and the prefetcher's, naming N and
    the backend; stock's engines log neither."""
    lines = identity["engagement"].get(f"{PLUGIN.name}/{runner.value}")
    if lines is None:
        pytest.skip(f"no plugin engine of {runner.value} ran")
    joined = " | ".join(lines)
    assert "sr_seed_prefetch plugin: vLLM" in joined, joined
    assert f"seeds for {model.mamba2_layers()} layers per forward" in joined, joined
    assert "flashinfer SSU" in joined and "unused" not in joined, joined
    for arm in (STOCK, STOCK_AGAIN):
        assert identity["engagement"].get(f"{arm.name}/{runner.value}", []) == [], arm.name


def test_no_file_of_vllm_changed(identity) -> None:
    """The plugin's engines ran the stock copy: every file the file patch changes is the
    release's, and no trace of the file patch is there."""
    if identity["site"] is None:
        pytest.skip("saved records: the site's files are checked where the engines ran")
    site = Path(identity["site"])
    release, _ = releases.base_of(tree.read_version(site) or "")
    for path, digest in releases.pristine_sha256()[release.version].items():
        if (site / path).is_file():
            assert hashlib.sha256((site / path).read_bytes()).hexdigest() == digest, path
    assert plugin.file_patch_marker(site) is None
