"""bench/engine/report.py: the markdown and merged JSON of engine runs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from . import compact, report, timing
from .arms import Runner
from .cpu_fakes import fake_record, instance_spawn, timing_settings


def test_report_compares_and_tabulates() -> None:
    stock = fake_record(["a" * 64, "b" * 64], [1, 2])
    same = fake_record(["a" * 64, "b" * 64], [1, 2])
    late = fake_record(["a" * 64, "c" * 64], [1, 3])
    assert compact.first_difference(stock["fingerprints"], late["fingerprints"]) == 1
    assert compact.first_difference(["a"], ["a", "b"]) == 1
    assert compact.first_difference(["a"], ["a"]) is None
    run = {
        "records": {
            "stock/v1/eager": stock,
            "flag-off/v1/eager": same,
            "reset/v1/eager": late,
            "reset-randint/v1/eager": {"error": "WorkerError: boom", "attempt": 2},
        }
    }
    merged = report.merge_identity([run])
    assert report.compare(merged["stock/v1/eager"][0], merged["flag-off/v1/eager"][0]) == (
        "identical"
    )
    table = report.identity_markdown(merged)
    row = next(line for line in table.splitlines() if line.startswith("| v1 | eager"))
    assert "| 2 / 1 |" in row and "identical" in row
    assert "state differs from step 1" in row and "did not run" in row
    tokens_only = fake_record(["a" * 64, "b" * 64], [1, 9])
    assert report.compare(compact.compact_record(stock), compact.compact_record(tokens_only)) == (
        "tokens differ"
    )


def test_report_names_the_first_layer_that_differs() -> None:
    stock = {
        **fake_record(["a" * 64, "b" * 64], [1, 2]),
        "layer_sums": [["0" * 32, "1" * 32]],
        "slot_sums": [["0" * 16, "1" * 16, "2" * 16]],
    }
    other = {
        **fake_record(["c" * 64, "b" * 64], [1, 2]),
        "layer_sums": [["0" * 32, "2" * 32]],
        "slot_sums": [["0" * 16, "f" * 16, "2" * 16]],
    }
    assert report.compare(compact.compact_record(stock), compact.compact_record(other)) == (
        "state differs from step 0 (layer 1 first; slots 1)"
    )
    # No per-layer sums kept for that step: the step alone.
    late = fake_record(["a" * 64, "c" * 64], [1, 2])
    assert report.compare(compact.compact_record(stock), compact.compact_record(late)) == (
        "state differs from step 1"
    )


def test_profile_markdown_names_the_kernels_an_arm_adds_or_drops() -> None:
    stock = {"1": {"steps": 4, "kernels": [["ssu", 40.0, 200.0], ["randint_kernel", 40.0, 80.0]]}}
    ours = {"1": {"steps": 4, "kernels": [["ssu", 40.0, 200.0], ["stock_seeds_kernel", 1.0, 2.0]]}}
    text = report.profile_markdown({"runners": {"v1": {"profile": {"stock": stock, "x": ours}}}})
    assert "**v1, BS 1: GPU kernels per decode step**" in text
    mtp = report.profile_markdown(
        {"serving": "mtp7", "runners": {"v1": {"profile": {"stock": stock}}}}
    )
    assert "**v1, BS 1: GPU kernels per mtp7 verify iteration**" in mtp
    assert "| stock | 80 | 280.0 | - | - | - | - |" in text
    assert (
        "| x | 41 | 202.0 | -78.0 | +0.0 | `randint_kernel` 0 (0.0 µs) vs 40 (80.0 µs); "
        "`stock_seeds_kernel` 1 (2.0 µs) vs 0 (0.0 µs) | none |"
    ) in text
    long = report._kernel("void f<" + "x" * 100 + ">(int|char)")
    assert len(long) == report.KERNEL_NAME_CHARS + 2 and long.endswith("…`")


def test_profile_markdown_names_the_kernels_launched_alike_most_apart_in_time() -> None:
    """Where an arm's offset is in kernels it launches as stock does (other picks,
    other placements), the table names the ones most apart, largest first."""
    stock = [["gemm", 80.0, 400.0], ["reduce", 40.0, 50.0], ["scan", 40.0, 120.0], ["n", 1, 9]]
    ours = [["gemm", 80.0, 407.6], ["reduce", 40.0, 46.0], ["scan", 40.0, 120.3], ["n", 2, 20]]
    extra = [["a", 1.0, 10.0], ["b", 1.0, 10.0], ["c", 1.0, 10.0], ["d", 1.0, 10.0]]
    more = [["a", 1.0, 11.0], ["b", 1.0, 12.0], ["c", 1.0, 13.0], ["d", 1.0, 14.0]]
    profiles = {"stock": {"1": {"kernels": stock + extra}}, "x": {"1": {"kernels": ours + more}}}
    text = report.profile_markdown({"runners": {"v2": {"profile": profiles}}})
    # gemm +7.6, then d +4.0 and reduce -4.0 (ties by name; c +3.0, b +2.0 and a +1.0
    # are cut at three); scan's 0.3 is below PROFILE_APART_US; n launched other than in
    # stock.
    assert "| `gemm` +7.6; `d` +4.0; `reduce` -4.0 |" in text
    assert "`n` 2 (20.0 µs) vs 1 (9.0 µs)" in text
    # Apart from stock: +11.0 in the kernel launched otherwise, +13.9 in those alike.
    assert "| x | 166 | 643.9 | +11.0 | +13.9 |" in text


def test_report_cli(tmp_path: Path) -> None:
    identity = tmp_path / "identity.json"
    identity.write_text(json.dumps({"records": {"stock/v1/eager": fake_record(["a"], [1])}}))
    rows = timing.summarize({"stock": [3e-3] * 12, "x": [2.9e-3] * 12}, "stock", "v1", 1)
    timed = tmp_path / "timing.json"
    timed.write_text(json.dumps({"runners": {"v1": {"summary": {"step": {"1": rows}}}}}))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.engine.report",
            "--identity",
            str(identity),
            "--timing",
            str(timed),
            "--prefix",
            str(tmp_path / "out"),
        ],
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    text = (tmp_path / "out.md").read_text()
    assert "| 1 | x | 12 | 2900 " in text and "| 100 [100, 100] |" in text
    assert json.loads((tmp_path / "out.identity.json").read_text())["records"]


def test_timing_files_of_different_runners_merge() -> None:
    v1 = {"runners": {"v1": {"summary": {}}}, "plan": {"rounds": 10}, "gpus": ["0"]}
    v2 = {"runners": {"v2": {"summary": {}}}, "plan": {"rounds": 8}, "gpus": ["0"]}
    assert report.merge_timing([v1]) is v1
    merged = report.merge_timing([v1, v2])
    assert merged["runners"] == {"v1": {"summary": {}}, "v2": {"summary": {}}}
    assert [run["plan"]["rounds"] for run in merged["runs"]] == [10, 8]
    with pytest.raises(SystemExit, match="a run of v1 without its samples"):
        report.merge_timing([v1, v1])


def test_microbench_predictions_follow_each_arms_variant() -> None:
    summary = [
        {"variant": v, "mode": m, "batch_size": 1, "median_us": us}
        for v, m, us in (
            ("stock", "graph", 245.0),
            ("reset-triton", "graph", 175.0),
            ("forward-context", "graph", 181.0),
            ("reset-triton", "eager", 1.0),
        )
    ]
    predicted = report.predictions(summary)
    assert predicted["reset", 1] == 70.0 and predicted["forward-context", 1] == 64.0
    assert predicted["flag-off", 1] == 0.0 and ("reset-randint", 1) not in predicted


def test_a_record_of_a_run_before_tp_is_rank_0s() -> None:
    flat = fake_record(["a" * 64, "b" * 64], [1, 2])
    (state,) = compact.rank_states(flat)
    assert state["rank"] == 0 and state["fingerprints"] == flat["fingerprints"]
    record = compact.compact_record(flat)
    assert record["tp"] == 1 and record["ranks"][0]["fingerprints"] == ["a" * 16, "b" * 16]
    # Judged as before TP: the verdicts name no rank.
    again = compact.compact_record(fake_record(["a" * 64, "b" * 64], [1, 2]))
    assert report.compare(record, again) == "identical"
    late = compact.compact_record(fake_record(["a" * 64, "c" * 64], [1, 2]))
    assert report.compare(record, late) == "state differs from step 1"


def test_timing_report_shows_each_rank_and_the_spread(tmp_path: Path) -> None:
    def sample(r0: float, r1: float) -> dict:
        return {
            "step_s": 3e-3,
            "replay_s": max(r0, r1),
            "rank_replay_s": [r0, r1],
            "replay_spread_s": abs(r0 - r1),
        }

    samples = {1: {"stock": [sample(1e-3, 1.1e-3)] * 12, "floor": [sample(9e-4, 9.4e-4)] * 12}}
    data = {"runners": {"v1": timing.runner_result(samples, "v1")}, "tp": 2}
    assert data["runners"]["v1"]["summary"]["replay"]["1"]["floor"]["saved_us"] == 160.0
    text = report.rank_markdown(data)
    assert "**v1, replay per TP rank**" in text
    assert "| BS | arm | n | rank 0 | rank 1 | spread (slowest - fastest rank) |" in text
    assert "| 1 | stock | 12 | 1000.0 | 1100.0 | 100.0 |" in text
    assert "| 1 | floor | 12 | 900.0 | 940.0 | 40.0 |" in text
    # One rank: no such table.
    one = {1: {"stock": [{"step_s": 3e-3, "replay_s": 1e-3, "rank_replay_s": [1e-3]}] * 12}}
    assert report.rank_markdown({"runners": {"v1": timing.runner_result(one, "v1")}}) == ""
    with pytest.raises(SystemExit, match=r"TP sizes \[1, 2\]"):
        report.merge_timing([{"runners": {"v1": {}}}, {"runners": {"v2": {}}, "tp": 2}])
    timed = tmp_path / "timing.json"
    timed.write_text(json.dumps(data))
    report.main(["--timing", str(timed), "--prefix", str(tmp_path / "out")])
    text = (tmp_path / "out.md").read_text()
    assert "TP 2: each step's figures are its slowest rank's." in text
    assert "## Replay per TP rank" in text


def test_report_names_each_serving_and_its_evidence() -> None:
    stock = {
        **fake_record(["a" * 64, "b" * 64], [1, 2]),
        "cached_tokens": {"r0": 0, "r5": 1056},
        "counters": {
            "vllm:spec_decode_num_drafts": 10,
            "vllm:spec_decode_num_draft_tokens": 70,
            "vllm:spec_decode_num_accepted_tokens": 3,
        },
    }
    merged = report.merge_identity(
        [
            {
                "records": {
                    "stock/v1/eager": fake_record(["a" * 64], [1]),
                    "stock/v1/FULL_AND_PIECEWISE/seed-serving": stock,
                    "reset/v1/FULL_AND_PIECEWISE/seed-serving": stock,
                }
            }
        ]
    )
    table = report.identity_markdown(merged)
    row = next(line for line in table.splitlines() if "/ seed-serving" in line)
    assert row.startswith("| v1 | FULL_AND_PIECEWISE / seed-serving | 2 / 1; ")
    assert "1 prefix-cache hits (1056 tokens); 10 drafts, 3 of 70 draft tokens accepted" in row
    assert "identical" in row
    # A serving's rows are only the cells it ran; plain's are all of them.
    assert sum("/ seed-serving" in line for line in table.splitlines()) == 1
    assert any(line.startswith("| v2 | PIECEWISE | missing") for line in table.splitlines())


def test_summary_reads_the_saving_against_both_floors() -> None:
    noise = [0.0, 5e-6, -3e-6, 8e-6, -6e-6, 2e-6, 1e-6, -4e-6, 7e-6, -2e-6, 3e-6, -1e-6]
    stock = [3e-3 + n for n in noise]
    rows = timing.summarize(
        {
            "stock": stock,
            "fast": [s - 1e-4 for s in stock],
            "floor": [s - 2e-4 for s in stock],
            "floor-rng": [s - 1.25e-4 for s in stock],
        },
        "stock",
        "v1",
        1,
    )
    assert rows["fast"]["recovered"] == pytest.approx(0.5)
    assert rows["fast"]["recovered_rng"] == pytest.approx(0.8)
    assert rows["fast"]["recovered_rng_ci95"] == pytest.approx([0.8, 0.8])
    assert "recovered_rng" not in rows["floor"] and "recovered" not in rows["floor-rng"]
    text = report.timing_markdown({"runners": {"v1": {"summary": {"step": {"1": rows}}}}})
    assert "| recovered [95% CI] | recovered vs floor-rng [95% CI] |" in text
    assert "| 0.50 [0.50, 0.50] | 0.80 [0.80, 0.80] |" in text


def test_a_partial_file_is_reported_as_the_steps_its_name_says(tmp_path: Path) -> None:
    assert report.steps_of_partial("timing-v2-seed-serving-mixed-partial.json", "v2") == (
        "seed-serving",
        "mixed",
    )
    assert report.steps_of_partial("timing-v1-partial.json", "v1") == ("plain", "decode")
    for name in ("timing-v1-mtp5-partial.json", "timing-v2-mtp7-partial.json", "x.json"):
        with pytest.raises(SystemExit, match=r"is not named timing-v1<tag>-partial\.json"):
            report.steps_of_partial(name, "v1")
    samples = json.dumps({"1": {"stock": [{"replay_s": 1e-3}]}})
    (tmp_path / "timing-v1-mtp7-partial.json").write_text(samples)
    (tmp_path / "timing-v2-partial.json").write_text(samples)
    with pytest.raises(SystemExit, match="of different steps"):
        report.from_partials(
            [
                f"v1={tmp_path / 'timing-v1-mtp7-partial.json'}",
                f"v2={tmp_path / 'timing-v2-partial.json'}",
            ]
        )


def test_the_mixed_report_leads_with_the_gpu_figure_and_counts_its_forwards(
    tmp_path: Path,
) -> None:
    sample = {
        "step_s": 12e-3,
        "forward_s": 11e-3,
        "replay_s": None,  # replays are counted, not timed
        "forward_gpu_s": 3e-3,
        "gpu_forwards": 12,
        "gpu_uncovered": 0,
        "replays_per_step": 49.0,
        "prefill_tokens": 126,
        "spun_host_s": 10.5e-3,
    }
    floor = {**sample, "forward_gpu_s": 2.92e-3, "gpu_forwards": 11, "gpu_uncovered": 1}
    samples = {2: {"stock": [sample], "floor": [floor]}}
    data = {"runners": {"v1": timing.runner_result(samples, "v1")}, "workload": "mixed"}
    (tmp_path / "timing-mixed.json").write_text(json.dumps(data))
    report.main(["--timing", str(tmp_path / "timing-mixed.json"), "--prefix", str(tmp_path / "r")])
    text = (tmp_path / "r.md").read_text()
    tables = [text.index(f"**v1, {name}**") for name in ("forward-gpu", "forward", "step")]
    assert tables == sorted(tables) and "**v1, replay**" not in text
    assert "| 2 | floor | 1 | 2920 n/a | 0 | 80 n/a |" in text
    assert (
        "- v1: forward-gpu over 23 forwards, 1 left out (the host was still enqueuing a "
        "segment when its spin ended); 10.5 ms of host time in a spun forward, 49 piecewise "
        "replays and a 126-token prefill chunk per step"
    ) in text


def test_the_timing_report_says_which_steps_it_times() -> None:
    assert report.steps_heading({"runners": {}}) == "## Decode step time\n"
    mtp = report.steps_heading({"serving": "mtp7", "workload": "decode"})
    assert mtp.startswith("## MTP verify iteration time (mtp7)") and "1 + 7 tokens" in mtp
    assert report.steps_heading({"workload": "mixed"}).startswith("## Mixed step time")
    one = {"runners": {"v1": {}}, "serving": "mtp7"}
    with pytest.raises(SystemExit, match="time different steps"):
        report.merge_timing([one, {"runners": {"v2": {}}}])
    merged = report.merge_timing([one, {"runners": {"v2": {}}, "serving": "mtp7"}])
    assert (merged["serving"], merged["workload"]) == ("mtp7", "decode")


@pytest.mark.parametrize(("workload", "figure"), [("mixed", "forward-gpu"), ("decode", "replay")])
def test_the_spread_between_engines_shows_only_with_several_and_holds_their_offset(
    tmp_path: Path, workload: str, figure: str
) -> None:
    """The control: each engine process's offset (n µs for the n-th) is in
    every sample of it, so one engine per arm has no spread to show."""
    plan = timing.Plan(rounds=3, batch_sizes=(1,), workload=workload)
    settings = timing_settings(tmp_path / "one", runners=(Runner.V1,))
    one, _ = timing.run(settings, plan, instance_spawn([]))
    assert "engines" not in one["runners"]["v1"] and report.engine_markdown(one) == ""
    plan = dataclasses.replace(plan, rounds_per_engine=1)
    settings = timing_settings(tmp_path, runners=(Runner.V1,))
    several, _ = timing.run(settings, plan, instance_spawn([]))
    entry = several["runners"]["v1"]["engines"][figure]["1"]["stock"]
    base = 5000.0 if figure == "forward-gpu" else 1000.0
    assert entry == {"rounds": [1, 1, 1], "median_us": [base, base + 1, base + 2], "spread_us": 2.0}
    text = report.engine_markdown(several)
    assert f"**v1, {figure}**: 3 engines per arm, 1 round each (µs)" in text
    assert f"| 1 | floor | 3 | {base:.1f}, {base + 1:.1f}, {base + 2:.1f} | 2.0 |" in text
    # The report's CLI adds the section from the run's file and from its partial
    # file, and not from the run of one engine per arm.
    md = tmp_path / "out"
    for source, shown in (
        (["--timing", str(tmp_path / f"timing{plan.tag}.json")], True),
        (["--partial", f"v1={tmp_path / f'timing-v1{plan.tag}-partial.json'}"], True),
        (["--timing", str(tmp_path / "one" / f"timing{plan.tag}.json")], False),
    ):
        report.main([*source, "--prefix", str(md)])
        assert ("## Engines per arm" in md.with_suffix(".md").read_text()) is shown


def test_a_runners_rounds_in_several_runs_are_put_together(tmp_path: Path) -> None:
    """Two device calls of one runner: 3 + 2 rounds, a new engine every round,
    are 5 engines per arm, paired round by round, summarized as one run."""
    settings = timing_settings(tmp_path / "a", runners=(Runner.V1,))
    first, _ = timing.run(
        settings, timing.Plan(rounds=3, batch_sizes=(1,), rounds_per_engine=1), instance_spawn([])
    )
    settings = timing_settings(tmp_path / "b", runners=(Runner.V1,))
    second, _ = timing.run(
        settings, timing.Plan(rounds=2, batch_sizes=(1,), rounds_per_engine=1), instance_spawn([])
    )
    merged = report.merge_timing([first, second])["runners"]["v1"]
    rows = merged["samples"]["1"]["stock"]
    assert [(row["engine"], row["instance"]) for row in rows] == [
        (0, 0),
        (1, 1),
        (2, 2),
        (3, 0),
        (4, 1),
    ]
    assert merged["summary"]["replay"]["1"]["floor"]["samples"] == 5
    assert merged["engines"]["replay"]["1"]["stock"]["median_us"] == [1000, 1001, 1002, 1000, 1001]
    # The partial files say the same.
    partials = [f"v1={tmp_path / run / 'timing-v1-partial.json'}" for run in ("a", "b")]
    assert report.from_partials(partials)["runners"]["v1"]["engines"] == merged["engines"]
    # Rounds that cannot pair are refused: other arms, or an arm short of rounds.
    other = json.loads(json.dumps(second))
    del other["runners"]["v1"]["samples"]["1"]["floor"]
    with pytest.raises(SystemExit, match="runs of v1 with different arms or batch sizes"):
        report.merge_timing([first, other])
    other["runners"]["v1"]["samples"]["1"]["floor"] = rows[:1]
    with pytest.raises(SystemExit, match="whose arms have different numbers of rounds"):
        report.merge_timing([first, other])


def test_engine_start_per_arm_is_read_off_the_samples() -> None:
    """Each engine's start once per arm, in engine order, from any of its samples;
    a record whose samples predate start_s has no such section."""
    row = {"replay_s": 1e-3}

    def of(engine: int, start_s: float) -> dict:
        return {**row, "engine": engine, "start_s": start_s}

    samples = {
        "1": {"stock": [of(0, 150.2), of(1, 31.0)], "reset": [of(0, 161.5), of(1, 30.4)]},
        "8": {"stock": [of(1, 31.0)], "reset": [row]},
    }
    text = report.start_markdown({"runners": {"v1": {"samples": samples}}})
    assert "| reset | 2 | 161.5, 30.4 |" in text and "| stock | 2 | 150.2, 31.0 |" in text
    old = {"1": {"stock": [row], "reset": [row]}}
    assert report.start_markdown({"runners": {"v1": {"samples": old}}}) == ""


def test_the_report_says_whether_every_engine_picked_alike() -> None:
    same = {"ssd_bmm.k": {"(128,)": "BLOCK: 32"}, "ssd_chunk_scan.k": {"(1,)": "W: 4"}}
    timing = {
        "runners": {},
        "autotune": {
            "picks": {"stock/v1/0": [same], "reset/v1/0": [same], "floor/v1/0": {"error": "x"}},
            "differences": {},
        },
    }
    text = report.autotune_markdown(timing)
    assert "2 kernel and tuning-key pairs in 2 engine ranks all picked alike." in text
    assert "Picks not read (the engine's reply failed): floor/v1/0." in text
    timing["autotune"]["differences"] = {
        "ssd_bmm.k[(128,)]": {"stock/v1/0/rank0": "BLOCK: 32", "reset/v1/0/rank0": "BLOCK: 64"}
    }
    text = report.autotune_markdown(timing)
    assert "1 picked otherwise:" in text
    assert "| ssd_bmm.k[(128,)] | BLOCK: 64 | reset/v1/0/rank0 |" in text
    assert report.autotune_markdown({"runners": {}}) == ""
    merged = {"runners": {}, "runs": [{"autotune": timing["autotune"]}]}
    assert "1 picked otherwise:" in report.autotune_markdown(merged)


def test_the_committed_form_keeps_the_count_and_the_inductor_kernels_apart() -> None:
    """compact names Inductor's kernels every engine picked alike once; the report
    counts them as before, and lists the one picked otherwise from the picks kept."""

    mamba = {"ssd_bmm.k": {"(128,)": "BLOCK: 32"}}
    same = {"inductor.a@1": {"config": "X: 8"}, "inductor.b@2": {"config": "X: 4"}}
    timing = {
        "runners": {},
        "autotune": {
            "picks": {
                "stock/v1/0": [mamba | same],
                "reset/v1/0": [mamba | same | {"inductor.b@2": {"config": "X: 2"}}],
            },
            "differences": {
                "inductor.b@2[config]": {"stock/v1/0/rank0": "X: 4", "reset/v1/0/rank0": "X: 2"}
            },
        },
    }
    before = report.autotune_markdown(timing)
    assert "3 kernel and tuning-key pairs in 2 engine ranks 1 picked otherwise:" in before
    committed = json.loads(compact.converted(json.dumps(timing)))
    assert committed["autotune"]["inductor_alike"] == ["inductor.a@1[config]"]
    assert all("inductor.a@1" not in ranks[0] for ranks in committed["autotune"]["picks"].values())
    assert report.autotune_markdown(committed) == before
    assert compact.converted(compact.converted(json.dumps(timing))) == compact.converted(
        json.dumps(timing)
    )


def test_a_bad_record_is_answered_in_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    good = tmp_path / "timing.json"
    good.write_text(json.dumps({"runners": {}}))
    prefix = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"^report: .*missing.json: \[Errno 2\]"):
        report.main(["--timing", str(tmp_path / "missing.json"), "--prefix", str(prefix)])
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match=r"^report: a record is not of the form its option"):
        report.main(["--identity", str(good), "--timing", str(bad), "--prefix", str(prefix)])
    assert not list(tmp_path.glob("out*")), "a bad input leaves no file written"
