"""The flag-off host cost of the runner's call site (bench/flag_off.py).

`test_flag_off_host_cost` is the benchmark (`pytest bench --benchmark-only`):
it runs the interleaved measurement once and puts its figures, per variant,
into `extra_info`; what pytest-benchmark itself times is one sample of the
flag-off call site.  The other tests check, on any machine, that the script
runs and that what it times is what the patch lands.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from runner_hooks.hooks import ForwardHooks

from . import flag_off

pytest.importorskip("pytest_benchmark", reason="the bench needs pytest-benchmark")

REPO = Path(__file__).resolve().parents[1]


def test_flag_off_host_cost(benchmark) -> None:
    rows = flag_off.summarize(flag_off.measure(rounds=30, forwards=1000))
    benchmark.extra_info.update(rows)
    call, runner = flag_off.variants()["flag-off"]
    benchmark.pedantic(lambda: [call(runner, {}) for _ in range(1000)], rounds=5, iterations=1)


def test_the_script_writes_its_tables(tmp_path: Path) -> None:
    assert flag_off.main(["--rounds", "10", "--forwards", "20", "--out", str(tmp_path / "r")]) == 0
    rows = json.loads((tmp_path / "r.json").read_text())
    assert set(rows) == set(flag_off.variants())
    assert rows["flag-off"]["over_stock_ci95_us"] is not None
    assert "| flag-off |" in (tmp_path / "r.md").read_text()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        flag_off.main(["--rounds", "0"])


def test_flag_off_reads_no_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no prefetcher attached, the site returns before it reads the metadata."""

    def refuse(attn_metadata: object) -> bool:
        raise AssertionError("the metadata was read with the flag off")

    monkeypatch.setitem(flag_off.STATE, "_batch_runs_mamba_ssu", refuse)
    flag_off.flag_off(flag_off.Runner(ForwardHooks()), {})  # would raise if it read it


def test_the_timed_site_is_the_landed_one() -> None:
    """The flag-off variant opens the item the V1 runner gets
    (landing/runner_forward_item.py) on the landed sr_seed_forward."""
    landed = ast.parse((REPO / "vllm_patch/landing/runner_forward_item.py").read_text())
    timed = ast.parse(Path(flag_off.__file__).read_text())
    function = next(
        n for n in ast.walk(timed) if isinstance(n, ast.FunctionDef) and n.name == "flag_off"
    )
    item = function.body[0].items[1].context_expr  # type: ignore[attr-defined]
    # The part that evaluates the expression alone evaluates the same one.
    part = next(
        n for n in ast.walk(timed) if isinstance(n, ast.FunctionDef) and n.name == "expression_only"
    )
    assert ast.unparse(part.body[1].value) == ast.unparse(item)  # type: ignore[attr-defined]
    expected = ast.unparse(landed.body[0].value)  # type: ignore[attr-defined]
    normalized = (
        expected.replace("ATTN_METADATA", "attn_metadata")
        .replace("UBATCH_SLICES is not None", "False")
        .replace("CUDAGRAPH_MODE == CUDAGraphMode.FULL", "False")
    )
    assert ast.unparse(item) == normalized
    assert flag_off.sr_seed_forward.__code__.co_filename == str(flag_off.LANDING)
