"""bench/engine/timing.py: interleaved rounds, their summary and the timing run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from . import arms, report, session, timing
from .arms import STOCK, TIMING_ARMS, Runner
from .client import WorkerError
from .cpu_fakes import (
    FakeWorker,
    QuickWorker,
    instance_spawn,
    quick_spawn,
    timing_settings,
)


def test_interleave_shuffles_rounds_with_a_fixed_seed() -> None:
    plan = timing.Plan(rounds=6, batch_sizes=(1, 8))
    calls: list[tuple[str, int]] = []

    def sample(arm: str, bs: int) -> dict[str, float]:
        calls.append((arm, bs))
        return {"step_s": 1.0, "forward_s": None}

    samples = timing.interleave(["a", "b", "c"], plan, "v1", sample)
    rounds = [calls[i : i + 6] for i in range(0, len(calls), 6)]
    assert all(sorted(r) == sorted(rounds[0]) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1, "every round in the same order"
    again: list[tuple[str, int]] = []
    timing.interleave(["a", "b", "c"], plan, "v1", lambda a, b: again.append((a, b)) or {})
    assert again == calls
    assert timing.column(samples, "step_s")[8]["b"] == [1.0] * 6
    assert timing.column(samples, "forward_s")[1]["a"] == []


def test_summary_reads_a_saving_off_paired_rounds() -> None:
    noise = [0.0, 5e-6, -3e-6, 8e-6, -6e-6, 2e-6, 1e-6, -4e-6, 7e-6, -2e-6, 3e-6, -1e-6]
    stock = [3e-3 + n for n in noise]
    rows = timing.summarize({"stock": stock, "fast": [s - 1e-4 for s in stock]}, "stock", "v1", 1)
    assert rows["fast"]["saved_us"] == pytest.approx(100.0)
    low, high = rows["fast"]["saved_ci95_us"]
    assert low == pytest.approx(100.0) and high == pytest.approx(100.0)
    assert rows["fast"]["ratio_to_stock"] == pytest.approx(0.9667, abs=1e-4)
    assert "saved_us" not in rows["stock"] and rows["stock"]["median_ci95_us"] is not None
    floored = timing.summarize(
        {"stock": stock, "fast": [s - 1e-4 for s in stock], "floor": [s - 2e-4 for s in stock]},
        "stock",
        "v1",
        1,
    )
    assert floored["fast"]["recovered"] == pytest.approx(0.5)
    assert floored["fast"]["recovered_ci95"] == pytest.approx([0.5, 0.5])
    assert "recovered" not in floored["floor"] and "recovered" not in rows["fast"]
    few = timing.summarize({"stock": stock[:3], "fast": stock[:3]}, "stock", "v1", 1)
    assert few["fast"]["saved_ci95_us"] is None and few["fast"]["ratio_ci95"] is None


def test_the_timing_profiles_every_engine_after_the_rounds(tmp_path: Path) -> None:
    calls: list[tuple[str, str, dict]] = []
    spawn = quick_spawn(calls)
    settings = session.Settings({}, ("0", "1"), tmp_path, (Runner.V1,))
    plan = timing.Plan(rounds=2, batch_sizes=(1, 8), profile_batch_sizes=(8,))
    data, _ = timing.run(settings, plan, spawn=spawn)
    profiled = [(name, args["bs"]) for name, op, args in calls if op == "profile"]
    assert profiled == [(f"{arm.name}/v1", 8) for arm in TIMING_ARMS]
    last_decode = max(i for i, (_, op, _) in enumerate(calls) if op == "decode")
    assert last_decode < min(i for i, (_, op, _) in enumerate(calls) if op == "profile")
    assert data["runners"]["v1"]["profile"]["stock"]["8"]["kernels"] == [["k", 1.0, 2.0]]
    unprofiled, _ = timing.run(settings, timing.Plan(rounds=2, batch_sizes=(1,)), spawn=spawn)
    assert "profile" not in unprofiled["runners"]["v1"]


def test_a_failed_profile_keeps_the_rounds_figures(tmp_path: Path) -> None:
    class ProfilerFails(QuickWorker):
        def call(self, op: str, **args: object) -> dict:
            if op == "profile" and self.name.startswith(STOCK.name):
                raise WorkerError(f"{self.name}: RuntimeError: CUPTI")
            return super().call(op, **args)

    def spawn(pairs, settings, tag, extra_env):
        return {(a.name, r.value): ProfilerFails(f"{a.name}/{r.value}", []) for a, r in pairs}

    settings = session.Settings({}, ("0",), tmp_path, (Runner.V1,))
    plan = timing.Plan(rounds=2, batch_sizes=(1,), profile_batch_sizes=(1,))
    data, _ = timing.run(settings, plan, spawn=spawn)
    profiles = data["runners"]["v1"]["profile"]
    assert profiles[STOCK.name]["1"] == {"error": "stock/v1: RuntimeError: CUPTI"}
    assert profiles["floor"]["1"]["kernels"] == [["k", 1.0, 2.0]]
    assert data["runners"]["v1"]["summary"]["step"]["1"]
    assert (tmp_path / "timing.json").is_file()
    text = report.profile_markdown(data)
    assert "| stock | - | - | - | - | no profile: stock/v1: RuntimeError: CUPTI | - |" in text


def test_timing_run_measures_runners_in_turn(tmp_path: Path) -> None:
    from .session import Settings

    log: list[str] = []

    class Timed(FakeWorker):
        def call(self, op: str, **args: object) -> dict:
            self.log.append(f"{self.name} {op}")
            if op == "start" and self.fail:
                raise WorkerError(f"{self.name}: no kernel")
            if op == "start":
                return {"start_s": 1.0}
            if op == "autotune":
                return {"picks": [{}]}
            saved = 1e-4 if self.name.startswith("reset") else 0.0
            return {"step_s": 3e-3 - saved, "forward_s": 2e-3 - saved, "forwards": 8}

    def spawn(pairs, settings, tag, extra_env):
        assert tag == "timing" and extra_env == arms.DETERMINISTIC_ENV
        return {
            (a.name, r.value): Timed(f"{a.name}/{r.value}", log, a.name == "forward-context")
            for a, r in pairs
        }

    plan = timing.Plan(rounds=10, batch_sizes=(1, 8))
    data, workers = timing.run(Settings({}, ("0", "1"), tmp_path), plan, spawn=spawn)
    assert data["failed"] == {
        "forward-context/v1": "WorkerError: forward-context/v1: no kernel",
        "forward-context/v2": "WorkerError: forward-context/v2: no kernel",
    }
    decodes = [line.split()[0] for line in log if line.endswith("decode")]
    assert decodes, log
    # Every engine has started before the first round.
    starts = [i for i, line in enumerate(log) if line.endswith(" start")]
    assert len(starts) == len(TIMING_ARMS) * len(Runner)
    assert max(starts) < log.index(next(line for line in log if line.endswith("decode")))
    first_v2 = next(i for i, name in enumerate(decodes) if name.endswith("/v2"))
    assert all(name.endswith("/v1") for name in decodes[:first_v2]), "runners overlapped"
    assert len(decodes) == 2 * plan.rounds * len(plan.batch_sizes) * (len(TIMING_ARMS) - 1)
    row = data["runners"]["v2"]["summary"]["forward"]["8"]["reset"]
    assert row["saved_us"] == pytest.approx(100.0) and row["samples"] == 10
    assert "forward-context" not in data["runners"]["v1"]["summary"]["step"]["1"]
    assert json.loads((tmp_path / "timing.json").read_text())["plan"]["rounds"] == 10
    assert set(workers) == {(a.name, r.value) for a in TIMING_ARMS for r in Runner}


def test_timing_run_records_its_tp(tmp_path: Path) -> None:
    settings = session.Settings({}, ("0", "1"), tmp_path, (Runner.V1,), tp=2)
    data, _ = timing.run(settings, timing.Plan(rounds=2, batch_sizes=(1,)), spawn=quick_spawn([]))
    assert data["tp"] == 2 and json.loads((tmp_path / "timing.json").read_text())["tp"] == 2


def test_the_timing_plan_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = timing.Plan.from_env()
    assert (plan.serving, plan.workload, plan.tag) == ("plain", "decode", "")
    monkeypatch.setenv(timing.TIMING_SERVING_ENV, "mtp7")
    assert timing.Plan.from_env().tag == "-mtp7"
    monkeypatch.setenv(timing.WORKLOAD_ENV, "mixed")
    monkeypatch.setenv(timing.ROUNDS_ENV, "3")
    plan = timing.Plan.from_env()
    assert plan.tag == "-mtp7-mixed" and plan.rounds == 3
    assert plan.batch_sizes == timing.MIXED_BATCH_SIZES == (1, 2, 4)
    assert (plan.steps, plan.step_tokens) == (timing.MIXED_STEPS, timing.MIXED_STEP_TOKENS)
    assert timing.Plan().step_tokens is None
    with pytest.raises(ValueError, match="SR_ENGINE_TIMING_SERVING takes one of"):
        timing.Plan(serving="mtp5")
    with pytest.raises(ValueError, match="SR_ENGINE_WORKLOAD takes one of"):
        timing.Plan(workload="prefill")
    monkeypatch.setenv(timing.TIMING_SERVING_ENV, "prefix")
    with pytest.raises(ValueError, match="step budget must hold a block: a step budget of 128"):
        timing.Plan.from_env()


@pytest.mark.parametrize(("serving", "workload"), [("mtp7", "decode"), ("plain", "mixed")])
def test_the_timing_starts_its_serving_and_times_its_workload(
    tmp_path: Path, serving: str, workload: str
) -> None:
    calls: list[tuple[str, str, dict]] = []
    step_tokens = timing.MIXED_STEP_TOKENS if workload == "mixed" else None
    plan = timing.Plan(
        rounds=2, batch_sizes=(1,), serving=serving, workload=workload, step_tokens=step_tokens
    )
    settings = session.Settings({}, ("0",), tmp_path, (Runner.V1,))
    data, _ = timing.run(settings, plan, spawn=quick_spawn(calls))
    starts = [(args["serving"], args["step_tokens"]) for _, op, args in calls if op == "start"]
    assert set(starts) == {(serving, step_tokens)}
    assert {op for _, op, _ in calls if op not in ("start", "autotune")} == {workload}
    saved = json.loads((tmp_path / f"timing{plan.tag}.json").read_text())
    assert (
        (saved["serving"], saved["workload"]) == (serving, workload) == (data["serving"], workload)
    )
    partial = tmp_path / f"timing-v1{plan.tag}-partial.json"
    # A run cut off by its time limit is reported from the partial files, as its steps.
    reported = report.from_partials([f"v1={partial}"])
    assert (reported["serving"], reported["workload"]) == (serving, workload)
    assert report.steps_heading(reported) == report.steps_heading(saved)


def test_the_profile_takes_batch_sizes_the_workload_times(monkeypatch) -> None:
    monkeypatch.setenv(timing.WORKLOAD_ENV, "mixed")
    monkeypatch.setenv(session.PROFILE_ENV, "1,8")
    with pytest.raises(ValueError, match=r"mixed timing measures \(1, 2, 4\); got \(1, 8\)"):
        timing.Plan.from_env()
    monkeypatch.setenv(session.PROFILE_ENV, "1,4")
    assert timing.Plan.from_env().profile_batch_sizes == (1, 4)


@pytest.mark.parametrize(
    ("rounds", "every", "engines"),
    [(4, 2, [0, 0, 1, 1]), (5, 2, [0, 0, 1, 1, 2]), (3, 1, [0, 1, 2]), (3, None, [0, 0, 0])],
)
def test_the_timing_starts_a_runners_engines_again_every_k_rounds(
    tmp_path: Path, rounds: int, every: int | None, engines: list[int]
) -> None:
    log: list[tuple] = []
    plan = timing.Plan(rounds=rounds, batch_sizes=(1, 2), rounds_per_engine=every)
    data, workers = timing.run(timing_settings(tmp_path), plan, spawn=instance_spawn(log))
    spawns = [(tag, names) for kind, tag, names, *_ in log if kind == "spawn"]
    later = [
        (f"timing-engine{engine}", [f"stock/{runner}", f"floor/{runner}"])
        for runner in ("v1", "v2")
        for engine in sorted(set(engines) - {0})
    ]
    assert spawns == [("timing", ["stock/v1", "floor/v1", "stock/v2", "floor/v2"]), *later]
    for runner in ("v1", "v2"):
        for bs in ("1", "2"):
            for arm in ("stock", "floor"):
                rows = data["runners"][runner]["samples"][bs][arm]
                assert [row["engine"] for row in rows] == engines
                assert all(row["engine"] == row["instance"] for row in rows)
                # Each sample carries its own engine's start (a start call, timed).
                assert all(isinstance(row["start_s"], float) for row in rows)
    # Every engine is closed before its successor spawns (and an FakeInstance
    # refuses calls after its close).
    for index, (kind, tag, names, *_) in enumerate(log):
        if kind == "spawn" and tag != "timing":
            closed = {(name, n) for kind, name, n, *_ in log[:index] if kind == "close"}
            engine = int(tag.removeprefix("timing-engine"))
            assert {(name, engine - 1) for name in names} <= closed
    # V2 starts again only after V1's last sample.
    last_v1 = max(i for i, e in enumerate(log) if e[0] == "call" and e[1].endswith("/v1"))
    first_v2_again = [
        i
        for i, (kind, tag, names, *_) in enumerate(log)
        if kind == "spawn" and tag != "timing" and names[0].endswith("/v2")
    ]
    assert all(i > last_v1 for i in first_v2_again)
    # The caller gets the last engines, running.
    assert {key: (w.n, w.closed) for key, w in workers.items()} == {
        (arm, runner): (engines[-1], False) for arm in ("stock", "floor") for runner in ("v1", "v2")
    }
    assert data["plan"]["rounds_per_engine"] == every and not data["failed"]


def test_a_failed_restart_is_recorded_and_its_arm_drops_out(tmp_path: Path) -> None:
    log: list[tuple] = []
    spawn = instance_spawn(log, fail_spawn={("floor/v1", 1)}, fail_start={("floor-rng/v1", 2)})
    settings = timing_settings(tmp_path, names=("stock", "floor", "floor-rng"))
    plan = timing.Plan(rounds=3, batch_sizes=(1,), rounds_per_engine=1)
    data, workers = timing.run(settings, plan, spawn=spawn)
    assert data["failed"] == {
        "floor/v1": "engine 1: WorkerError: floor/v1: the worker died",
        "floor-rng/v1": "engine 2: WorkerError: floor-rng/v1: no kernel",
    }
    assert json.loads((tmp_path / "timing.json").read_text())["failed"] == data["failed"]
    samples = data["runners"]["v1"]["samples"]["1"]
    engines = {arm: [row["engine"] for row in rows] for arm, rows in samples.items()}
    assert engines == {"stock": [0, 1, 2], "floor": [0], "floor-rng": [0, 1]}
    # The arm whose engine did not restart is not started again; the other runner keeps all.
    spawns = [names for kind, tag, names, *_ in log if kind == "spawn" and tag == "timing-engine2"]
    assert spawns[0] == ["stock/v1", "floor-rng/v1"]
    v2 = data["runners"]["v2"]["samples"]["1"]
    assert all([row["engine"] for row in rows] == [0, 1, 2] for rows in v2.values())
    assert isinstance(workers["floor", "v1"], WorkerError)


def test_the_rounds_per_engine_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert timing.Plan.from_env().rounds_per_engine is None
    monkeypatch.setenv(timing.WORKLOAD_ENV, "mixed")
    assert timing.Plan.from_env().rounds_per_engine == timing.MIXED_ROUNDS_PER_ENGINE == 1
    monkeypatch.setenv(timing.ROUNDS_PER_ENGINE_ENV, "3")
    assert timing.Plan.from_env().rounds_per_engine == 3
    monkeypatch.delenv(timing.WORKLOAD_ENV)
    assert timing.Plan.from_env().rounds_per_engine == 3
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv(timing.ROUNDS_PER_ENGINE_ENV, bad)
        with pytest.raises(
            ValueError, match="SR_ENGINE_ROUNDS_PER_ENGINE takes a number of rounds"
        ):
            timing.Plan.from_env()


def test_the_first_engine_starts_alone_and_every_engines_picks_are_kept(tmp_path: Path) -> None:
    """Engine 0's first start ends before any other begins (its Triton autotuning is
    every later engine's); each engine's picks are recorded, and an engine that picked
    otherwise is named in the differences."""
    events: list[tuple[str, str]] = []

    class Picking(QuickWorker):
        def call(self, op: str, **args: object) -> dict:
            if op == "start":
                events.append(("begin", self.name))
                time.sleep(0.05)  # side by side, the others would begin meanwhile
                events.append(("end", self.name))
            if op == "autotune":
                block = 64 if self.name == "floor/v2" else 32
                return {"picks": [{"ssd_bmm._bmm_chunk_fwd_kernel": {"(128,)": f"BLOCK: {block}"}}]}
            return super().call(op, **args)

    def spawn(pairs, settings, tag, extra_env):
        return {(a.name, r.value): Picking(f"{a.name}/{r.value}", []) for a, r in pairs}

    plan = timing.Plan(rounds=2, batch_sizes=(1,), rounds_per_engine=1)
    data, _ = timing.run(timing_settings(tmp_path), plan, spawn=spawn)
    assert events[:2] == [("begin", "stock/v1"), ("end", "stock/v1")]
    picks = data["autotune"]["picks"]
    assert set(picks) == {
        f"{a}/{r}/{e}" for a in ("stock", "floor") for r in ("v1", "v2") for e in (0, 1)
    }
    assert data["autotune"]["differences"] == {
        "ssd_bmm._bmm_chunk_fwd_kernel[(128,)]": {
            f"{a}/{r}/{e}/rank0": "BLOCK: 64" if (a, r) == ("floor", "v2") else "BLOCK: 32"
            for a in ("stock", "floor")
            for r in ("v1", "v2")
            for e in (0, 1)
        }
    }
