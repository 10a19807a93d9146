"""The paired run on CPU: two fake servers (cpu_fakes.py, real processes and HTTP) whose
ITL histograms grow by a known gap per token, the A B B A requests, the run file, and
the pooled report with its A/A decision."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from bench.engine.arms import Arm

from . import paired, server


@pytest.fixture(autouse=True)
def _no_pinning(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Every set is this process's first allowed CPU; the client's pinning is recorded,
    not done (the test process keeps its cores)."""
    monkeypatch.setattr(server, "POLL_S", 0.05)
    cpu = min(os.sched_getaffinity(0))
    monkeypatch.setattr(paired.cores, "core_sets", lambda n, each, root: [[cpu]] * n)
    pinned: list[list[int]] = []
    monkeypatch.setattr(paired.os, "sched_setaffinity", lambda pid, cpus: pinned.append(cpus))
    return pinned


def one_run(tmp_path: Path, index: int, a: str, b: str, itl: dict[str, float]) -> Path:
    out = tmp_path / f"run{index}.jsonl"
    argv = ["run", "--a", a, "--b", b, "--pairs", "6", "--warmup", "1"]
    args = paired.parser().parse_args([*argv, "--max-tokens", "4", "--out", str(tmp_path)])

    def launch(name: str, arm: Arm, cpus: list[int], log: Path) -> server.Server:
        env = {**os.environ, "FAKE_ITL_S": str(itl[name]), "SR_ENGINE_ARM": arm.name}
        fake = [sys.executable, "-m", "bench.serve.cpu_fakes", "--port"]
        return server.Server.launch(lambda port: [*fake, str(port)], env, log)

    paired.run(args, index, out, launch, vocab=1000, server_argv=["serve"], start_timeout=30)
    return out


def test_a_run_writes_its_header_its_pairs_and_the_machine(tmp_path: Path, _no_pinning) -> None:
    out = one_run(tmp_path, 0, "stock", "reset", {"A": 0.004, "B": 0.005})
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["run"] + ["pair"] * 6 + ["machine"]
    header, pairs = lines[0], lines[1:-1]
    assert (header["a"], header["b"], header["server_argv"]) == ("stock", "reset", ["serve"])
    assert _no_pinning and _no_pinning[0] == header["cores"]["client"]
    assert [p["pair"] for p in pairs] == list(range(1, 7)), "the warm-up pair is not written"
    assert [p["order"] for p in pairs] == ["BA", "AB"] * 3
    for p in pairs:
        assert p["A"]["server_itl_s"] == pytest.approx(0.004)
        assert p["B"]["server_itl_s"] == pytest.approx(0.005)
        assert p["A"]["output_tokens"] == 4 and p["B"]["client_itl_s"] > 0


def test_the_report_pools_runs_and_reads_the_known_ratio(tmp_path: Path) -> None:
    files = [one_run(tmp_path, r, "stock", "reset", {"A": 0.004, "B": 0.005}) for r in (0, 1)]
    summary = paired.summarize(files[0])
    assert summary.d == pytest.approx([math.log(1.25)] * 6)
    text = paired.report(files, effect=0.03)
    assert "Pooled: +25.00 % (+25.00 to +25.00 %, 95 %, t interval across runs)" in text
    assert "A/A" not in text, "an A/B run has no A/A decision"


def test_an_aa_run_is_decided_against_the_predicted_effect(tmp_path: Path) -> None:
    same = {"A": 0.004, "B": 0.004}
    files = [one_run(tmp_path, r, "stock", "stock", same) for r in (0, 1)]
    assert "A/A against a predicted effect of 3.00 %: go" in paired.report(files, effect=0.03)
    apart = [one_run(tmp_path, 2 + r, "stock", "stock", {"A": 0.004, "B": 0.0042}) for r in (0, 1)]
    assert ": no-go" in paired.report(apart, effect=0.03), "a 5 % offset is not A/A noise"


def test_runs_of_different_arms_or_a_file_of_something_else_are_refused(tmp_path: Path) -> None:
    ab = one_run(tmp_path, 0, "stock", "reset", {"A": 0.004, "B": 0.004})
    aa = one_run(tmp_path, 1, "stock", "stock", {"A": 0.004, "B": 0.004})
    with pytest.raises(paired.PairedRunError, match="different arms"):
        paired.report([ab, aa], effect=0.03)
    other = tmp_path / "other.jsonl"
    other.write_text('{"kind": "pair"}\n')
    assert paired.main(["report", "--effect", "0.03", str(other)]) == 1
    with pytest.raises(paired.PairedRunError, match="exists"):
        one_run(tmp_path, 0, "stock", "reset", {"A": 0.004, "B": 0.004})
