"""tests/gpu/vllm/test_engine_identity.py, the identity judge, on records: the committed
runs the READMEs quote, and made-up ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from . import arms, identity
from .arms import IDENTITY_ARMS, GraphMode, Runner

ENGINE_IDENTITY_TEST = "tests/gpu/vllm/test_engine_identity.py"
PLUGIN_TEST = "tests/gpu/test_plugin_engine.py"


def judged(
    records: str | Path, *pytest_args: str, test: str = ENGINE_IDENTITY_TEST
) -> tuple[dict[str, str], str]:
    """An identity test (the file patch's, or the plugin's) run on a records file
    (SR_ENGINE_RECORDS), with `pytest_args` (a -k selection): each test id's verdict,
    and its output."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"),
            *pytest_args,
            test,
        ],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "SR_ENGINE_RECORDS": str(records)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    verdicts = {
        line.split()[1].split("::")[1]: line.split()[0]
        for line in done.stdout.splitlines()
        if line.startswith(("PASSED ", "FAILED ", "ERROR "))
    }
    return verdicts, done.stdout


FULL_IDENTITY_RUN = "bench/results/engine-nvidia-h200x2-20261130e"
"""The identity run of every arm, runner and graph mode that the READMEs quote."""


def test_the_full_identity_run_reads_as_the_readmes_say() -> None:
    """The identity test itself, judging the committed records of FULL_IDENTITY_RUN
    (SR_ENGINE_RECORDS): every arm identical to stock for both runners and all
    three graph modes, stock in a second process too, both negative controls
    caught, stock not degenerate, the engagement lines right."""
    root = Path(__file__).resolve().parents[2]
    for readme in ("README.md", "bench/README.md"):
        assert f"{FULL_IDENTITY_RUN}.md" in (root / readme).read_text(), readme
    verdicts, output = judged(f"{FULL_IDENTITY_RUN}.identity.json")
    # The run's three modes: FULL_DECODE_ONLY joined identity.MODES later.
    modes = ("eager", "FULL_AND_PIECEWISE", "PIECEWISE")
    cells = [f"{runner}-{mode}" for runner in ("v1", "v2") for mode in modes]
    expected = {
        f"{test}[{cell}]"
        for cell in cells
        for test in ("test_stock_is_reproducible", "test_stock_is_not_degenerate")
    }
    patched = [
        arm.name
        for arm in arms.IDENTITY_ARMS
        if not arm.control and arm.name not in ("stock", "stock-again")
    ]
    # The run took reset-single too, an arm retired since (arms.RETIRED_ARMS).
    expected |= {
        f"test_identical_to_stock[{name}-{cell}]"
        for name in (*patched, "reset-single")
        for cell in cells
    }
    expected |= {
        f"test_negative_control_differs[{arm.name}-{cell}]"
        for arm in arms.IDENTITY_ARMS
        if arm.control
        for cell in cells
    }
    expected |= {"test_engagement_line[v1]", "test_engagement_line[v2]"}
    assert verdicts == dict.fromkeys(expected, "PASSED"), output[-3000:]


# Runs of the landing, the README quoting each: the records, the runners, and per
# group of cells judged (mode[-serving]) the patched arms run in them; the one-seed
# control runs in every cell.  The landing as it is now (d, vllm020), and its earlier
# cuts whose verdicts the README quotes too (2026-12-01 and b; the first of them
# before the serving configurations, so without their evidence).
BOTH = ("v1", "v2")
LANDING_RUNS = {
    "bench/results/engine-nvidia-h200-20261201d-plain": (
        BOTH,
        [(["eager", "FULL_AND_PIECEWISE"], ["reset", "forward-context"])],
    ),
    "bench/results/engine-nvidia-h200-20261201d-serving": (
        BOTH,
        [
            (
                [f"FULL_AND_PIECEWISE-{s}" for s in ("mtp3", "mtp7", "prefix", "seed-serving")],
                ["reset"],
            )
        ],
    ),
    # vLLM 0.20.0, whose V2 runner refuses hybrid models.
    "bench/results/engine-nvidia-h200-20261202-vllm020": (
        ("v1",),
        [
            (["eager", "FULL_AND_PIECEWISE"], ["reset", "forward-context"]),
            (["FULL_AND_PIECEWISE-seed-serving"], ["reset"]),
        ],
    ),
    "bench/results/engine-nvidia-h200-20261201b": (
        BOTH,
        [(["eager", "FULL_AND_PIECEWISE", "FULL_AND_PIECEWISE-seed-serving"], ["reset"])],
    ),
    "bench/results/engine-nvidia-h200-20261201": (
        BOTH,
        [(["eager", "FULL_AND_PIECEWISE"], ["reset"])],
    ),
}
LANDING_RUNS["bench/results/engine-nvidia-h200-20261203-reset"] = (
    # The PR's reshape; the device time ran out after V2's first (stock) engine.
    ("v1",),
    [(["eager", "FULL_AND_PIECEWISE"], ["reset"])],
)
LANDING_RUNS["bench/results/engine-nvidia-h200-20261203b-reset-v2"] = (
    # The V2 cells of the run above.
    ("v2",),
    [(["eager", "FULL_AND_PIECEWISE"], ["reset"])],
)
LANDING_RUNS["bench/results/engine-nvidia-h100-20261205-eager-seeds"] = (
    # No RNG inside any graph as the default; the time limit came before the
    # default's V1 FULL_AND_PIECEWISE record and after V2's first (stock) engine.
    ("v1",),
    [(["eager"], ["reset"]), (["FULL_AND_PIECEWISE"], [])],
)
STOCK_ONLY = {
    "bench/results/engine-nvidia-h200-20261203-reset": ("v2", "eager"),
    "bench/results/engine-nvidia-h100-20261205-eager-seeds": ("v2", "eager"),
}
"""Runs cut off after one more stock engine ran: its (runner, mode), judged on its own."""
BEFORE_SERVINGS = {"bench/results/engine-nvidia-h200-20261201"}
"""Runs whose records hold no serving evidence (test_serving_options_took_effect skips)."""


@pytest.mark.parametrize("run", sorted(LANDING_RUNS))
def test_the_landing_runs_read_as_the_readme_says(run: str) -> None:
    """A run's records judged again: its patched arms identical to stock, stock
    reproducible and not degenerate, the one-seed control caught and the serving
    options in effect (and off where the cell has none), for each of its runners,
    in each of its cells."""
    root = Path(__file__).resolve().parents[2]
    assert f"{run}.md" in (root / "README.md").read_text()
    verdicts, output = judged(f"{run}.identity.json")
    runners, groups = LANDING_RUNS[run]
    expected = set()
    for modes, patched in groups:
        tests = [
            "test_stock_is_reproducible",
            "test_stock_is_not_degenerate",
            *([] if run in BEFORE_SERVINGS else ["test_serving_options_took_effect"]),
            "test_negative_control_differs[control-one-seed",
            *(f"test_identical_to_stock[{arm}" for arm in patched),
        ]
        expected |= {
            f"{test}-{runner}-{mode}]" if "[" in test else f"{test}[{runner}-{mode}]"
            for test in tests
            for runner in runners
            for mode in modes
        }
    expected |= {f"test_engagement_line[{runner}]" for runner in runners}
    if run in STOCK_ONLY:
        runner, mode = STOCK_ONLY[run]
        expected |= {
            f"test_stock_is_not_degenerate[{runner}-{mode}]",
            f"test_serving_options_took_effect[{runner}-{mode}]",
            f"test_engagement_line[{runner}]",
        }
    assert verdicts == dict.fromkeys(expected, "PASSED"), output[-3000:]


# The plugin's runs (tests/gpu/test_plugin_engine.py): the records and the
# (runner-mode) cells in which stock, stock-again, the plugin and the one-seed control
# all ran (the 20261203 calls' time limits cut them before V2's FULL_AND_PIECEWISE cell).
PLUGIN_RUNS = {
    "bench/results/engine-nvidia-h200-20261203c-plugin": (
        ["v1-eager", "v1-FULL_AND_PIECEWISE", "v2-eager"],
        ["v1", "v2"],
    ),
    "bench/results/engine-nvidia-h200-20261203d-plugin-optin": (
        ["v1-FULL_AND_PIECEWISE"],
        ["v1"],
    ),
    "bench/results/engine-nvidia-h200-20261204-plugin-v2full": (
        ["v2-FULL_AND_PIECEWISE"],
        ["v2"],
    ),
    "bench/results/engine-nvidia-h200-20261204b-plugin-serving": (
        ["v1-FULL_AND_PIECEWISE-seed-serving"],
        ["v1"],
    ),
    "bench/results/engine-nvidia-h200-20261204e-plugin-serving-v2": (
        ["v2-FULL_AND_PIECEWISE-seed-serving"],
        ["v2"],
    ),
    "bench/results/engine-nvidia-h200-20261204d-plugin-vllm020": (
        ["v1-eager", "v1-FULL_AND_PIECEWISE"],
        ["v1"],
    ),
}


@pytest.mark.parametrize("run", sorted(PLUGIN_RUNS))
def test_the_plugin_runs_read_as_plugin_md_says(run: str) -> None:
    """The plugin's records judged again: in each cell, stock reproducible, the plugin
    identical to stock and the one-seed control caught; the plugin's engines logged
    both engagement lines."""
    root = Path(__file__).resolve().parents[2]
    assert f"{run}.md" in (root / "vllm_patch/PLUGIN.md").read_text()
    verdicts, output = judged(f"{run}.identity.json", test=PLUGIN_TEST)
    cells, runners = PLUGIN_RUNS[run]
    tests = (
        "test_stock_is_reproducible",
        "test_plugin_is_identical_to_stock",
        "test_negative_control_differs",
    )
    expected = {f"{test}[{cell}]" for test in tests for cell in cells}
    expected |= {f"test_plugin_engaged[{runner}]" for runner in runners}
    assert verdicts == dict.fromkeys(expected, "PASSED"), output[-3000:]


def test_the_plugin_judge_fails_on_a_differing_plugin(tmp_path: Path) -> None:
    """The control of the test above: the plugin's record of one cell replaced by the
    one-seed control's fails that cell's identity, and only that."""
    run = "bench/results/engine-nvidia-h200-20261203c-plugin"
    root = Path(__file__).resolve().parents[2]
    data = json.loads((root / f"{run}.identity.json").read_text())
    records = data["records"]
    records["plugin/v1/eager"] = records["control-one-seed/v1/eager"]
    mutated = tmp_path / "mutated.identity.json"
    mutated.write_text(json.dumps(data))
    verdicts, output = judged(mutated, test=PLUGIN_TEST)
    failed = {test for test, verdict in verdicts.items() if verdict != "PASSED"}
    assert failed == {"test_plugin_is_identical_to_stock[v1-eager]"}, output[-3000:]


# The opt-in arms' first engine run (bench/results/engine-nvidia-h200-20261203d-plugin-optin):
# V1 under FULL_AND_PIECEWISE only: the call's time limit cut it after V2's stock engine.
OPT_IN_RUN = "bench/results/engine-nvidia-h200-20261203d-plugin-optin"


def test_the_opt_in_arms_run_reads_as_its_record_says() -> None:
    """The file patch's identity test on that run: the out-of-graph and checked-once
    arms identical to stock on V1 under FULL_AND_PIECEWISE graphs, stock reproducible
    and not degenerate, the control caught, the engagement lines right."""
    verdicts, output = judged(f"{OPT_IN_RUN}.identity.json")
    cell = "v1-FULL_AND_PIECEWISE"
    expected = {
        f"test_stock_is_reproducible[{cell}]",
        f"test_stock_is_not_degenerate[{cell}]",
        f"test_serving_options_took_effect[{cell}]",
        f"test_negative_control_differs[control-one-seed-{cell}]",
        f"test_identical_to_stock[reset-outside-graph-{cell}]",
        f"test_identical_to_stock[reset-checked-once-{cell}]",
        "test_engagement_line[v1]",
        # Stock's V2 engine ran, alone: its own checks.
        "test_stock_is_not_degenerate[v2-FULL_AND_PIECEWISE]",
        "test_serving_options_took_effect[v2-FULL_AND_PIECEWISE]",
        "test_engagement_line[v2]",
    }
    assert verdicts == dict.fromkeys(expected, "PASSED"), output[-3000:]


def _tp2_records(differ: dict[str, dict[int, int]]) -> dict:
    """Records of every identity cell over 2 ranks: arm -> {rank: first step
    that differs from stock} (generator-seed's tokens differ too)."""
    from .identity import MODES, key

    steps = 70
    records = {}
    for arm in IDENTITY_ARMS:
        for runner in Runner:
            for mode in MODES:
                ranks = []
                for rank in range(2):
                    part = differ.get(arm.name, {}).get(rank, steps)
                    prints = [
                        (f"{rank}{i}" if i < part else f"{arm.name}{rank}{i}").ljust(64, "0")
                        for i in range(steps)
                    ]
                    ranks.append({"rank": rank, "fingerprints": prints, "state_sha256": prints[-1]})
                tokens = [2, 3] if arm.name == "control-generator-seed" else [1, 2]
                records[key(arm.name, runner, mode)] = {
                    "steps": steps,
                    "decode_steps": steps - 2,
                    "decoded": [False, False] + [True] * (steps - 2),
                    "tp": 2,
                    "ranks": ranks,
                    "sanity": {"finite_logprobs": True, "fewest_distinct_tokens": 2},
                    "tokens": {"r0": tokens},
                    "logprobs": {"r0": [[t, "-0x1p+0"] for t in tokens]},
                }
    return {"records": records, "engagement": {}}


def test_identity_is_judged_on_every_rank(tmp_path: Path) -> None:
    """tests/gpu/vllm/test_engine_identity.py on records of two ranks: an arm
    that differs from stock on rank 1 alone fails, and so does a control that
    differs on rank 0 alone; a control that differs on both passes."""
    path = tmp_path / "identity.json"
    differ = {
        "reset-randint": {1: 30},
        "control-one-seed": {0: 2},
        "control-generator-seed": {0: 0, 1: 0},
    }
    path.write_text(json.dumps(_tp2_records(differ)))
    verdicts, output = judged(
        path, "-k", "v1-eager and (identical_to_stock or negative_control or reproducible)"
    )
    failed = {name for name, verdict in verdicts.items() if verdict == "FAILED"}
    assert failed == {
        "test_identical_to_stock[reset-randint-v1-eager]",
        "test_negative_control_differs[control-one-seed-v1-eager]",
    }, output[-3000:]
    assert verdicts["test_identical_to_stock[reset-v1-eager]"] == "PASSED"
    assert verdicts["test_negative_control_differs[control-generator-seed-v1-eager]"] == "PASSED"
    assert verdicts["test_stock_is_reproducible[v1-eager]"] == "PASSED"
    assert "rank 0: the state does not differ" not in output  # rank 1's is the one
    assert "rank 1: the state does not differ" in output
    assert "{1: 30}" in output


def _serving_records(cached: dict[str, int], counters: dict[str, float]) -> dict:
    """_tp2_records' V1 FULL_AND_PIECEWISE cells of stock and stock-again under
    the prefix serving, each with these prefix-cache figures."""
    records = _tp2_records({})["records"]
    full = GraphMode.FULL_AND_PIECEWISE
    out = {}
    for arm in ("stock", "stock-again"):
        for serving in (arms.PLAIN, arms.SERVING_BY_NAME["prefix"]):
            cell = identity.key(arm, Runner.V1, full, serving)
            evidence = {"cached_tokens": cached, "block_size": 64, "counters": counters}
            if serving == arms.PLAIN:
                evidence = {"cached_tokens": dict.fromkeys(cached, 0), "block_size": 64}
            out[cell] = {**records[identity.key(arm, Runner.V1, full)], **evidence}
    return {"records": out, "engagement": {}}


@pytest.mark.parametrize(
    ("cached", "hits", "fails"),
    [
        ({"r0": 0, "r5": 64, "r8": 64, "r10": 64}, 192, False),
        ({"r0": 0, "r5": 64, "r8": 0, "r10": 64}, 128, True),  # one later request missed
        ({"r0": 0, "r5": 64, "r8": 64, "r10": 64}, 0, True),  # vLLM counted no hit
    ],
)
def test_the_judge_needs_prefix_cache_hits(
    tmp_path: Path, cached: dict[str, int], hits: int, fails: bool
) -> None:
    """test_serving_options_took_effect on records of the prefix serving: it
    fails where a request that shares the prefix found no block in the cache,
    or vLLM counted no hit; the plain cell (no hits) passes."""
    path = tmp_path / "identity.json"
    path.write_text(json.dumps(_serving_records(cached, {"vllm:prefix_cache_hits": hits})))
    verdicts, output = judged(path, "-k", "serving_options and v1-FULL_AND_PIECEWISE")
    assert verdicts == {
        "test_serving_options_took_effect[v1-FULL_AND_PIECEWISE]": "PASSED",
        "test_serving_options_took_effect[v1-FULL_AND_PIECEWISE-prefix]": (
            "FAILED" if fails else "PASSED"
        ),
    }, output[-3000:]
