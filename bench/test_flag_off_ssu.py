"""The flag-off host cost per SSU call of the seed site (bench/flag_off_ssu.py).

`test_flag_off_ssu_cost` is the benchmark (`pytest bench/test_flag_off_ssu.py
--benchmark-only`): it runs the interleaved measurement once and puts its figures,
per variant, into `extra_info`; pytest-benchmark itself times 5000 calls of the
landed site. The other tests check that the script runs and times the landed text.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from . import flag_off_ssu

pytest.importorskip("pytest_benchmark", reason="the bench needs pytest-benchmark")


def test_flag_off_ssu_cost(benchmark) -> None:
    rows = flag_off_ssu.summarize(flag_off_ssu.measure(rounds=60, calls=5000))
    benchmark.extra_info.update(rows)
    call = flag_off_ssu.variants()["flag-off, landed (bare)"]
    device = torch.device("cpu")
    benchmark.pedantic(lambda: [call(device) for _ in range(5000)], rounds=20, iterations=1)


def test_the_script_writes_its_tables(tmp_path: Path) -> None:
    out = tmp_path / "r"
    assert flag_off_ssu.main(["--rounds", "10", "--calls", "20", "--out", str(out)]) == 0
    rows = json.loads(out.with_suffix(".json").read_text())
    assert set(rows) == set(flag_off_ssu.variants())
    assert rows["flag-off, landed (bare)"]["over_stock_ci95_us"] is not None
    assert "per SSU call" in out.with_suffix(".md").read_text()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        flag_off_ssu.main(["--calls", "0"])


def test_the_timed_function_is_the_landed_one_and_draws_as_stock() -> None:
    landed = flag_off_ssu.seed_site(
        torch, flag_off_ssu._functions(flag_off_ssu.GATE, {"sr_rand_seed"}), "landed"
    )
    code = landed.__code__
    assert code.co_filename == "landed" and "prefetched_sr_seed" in code.co_names
    torch.manual_seed(3)
    expected = torch.randint(0, 2**32, (1,))
    torch.manual_seed(3)
    assert torch.equal(landed(torch.device("cpu")), expected)
