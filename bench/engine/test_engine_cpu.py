"""The engine runs' parts that need no GPU: model, arms, worker protocol, timing, report."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from . import arms, client, identity, model, report, session, timing, worker
from .arms import ARMS, BY_NAME, CONTROLS, IDENTITY_ARMS, STOCK, TIMING_ARMS, GraphMode, Runner
from .client import Worker, WorkerError, sites_from_env


def test_rank_config_is_one_tp4_rank_of_the_public_model() -> None:
    config = model.model_config()
    pattern = config["hybrid_override_pattern"]
    assert len(model.SUPER["hybrid_override_pattern"]) == 88
    assert pattern == model.SUPER["hybrid_override_pattern"].replace("E", "-")
    assert (pattern.count("M"), pattern.count("-"), pattern.count("*")) == (40, 40, 8)
    assert config["num_hidden_layers"] == 88 and model.mamba2_layers() == 40
    # The microbench's mixer: 32 heads x 64, state 128, 2 groups per rank.
    assert (config["mamba_num_heads"], config["mamba_head_dim"]) == (32, 64)
    assert (config["ssm_state_size"], config["n_groups"], config["mamba_n_groups"]) == (128, 2, 2)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (8, 1)
    assert config["vocab_size"] == 32768 and config["intermediate_size"] == 1344


def test_model_dir_holds_the_config(tmp_path: Path) -> None:
    folder = model.write_model_dir(tmp_path / "m")
    assert json.loads((folder / "config.json").read_text()) == model.model_config()


class _Mixer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.A = torch.nn.Parameter(torch.zeros(32))
        self.D = torch.nn.Parameter(torch.zeros(32))
        self.dt_bias = torch.nn.Parameter(torch.zeros(32))
        self.in_proj = torch.nn.Linear(256, 64, bias=False)
        self.conv1d = torch.nn.Linear(4, 48)
        self.norm = torch.nn.LayerNorm(64)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(100, 64)
        self.mixer = _Mixer()


def test_init_weights_scale_and_seed() -> None:
    net, again, other = _Net(), _Net(), _Net()
    rng_before = torch.random.get_rng_state()
    assert model.init_weights(net) == len(list(net.parameters()))
    model.init_weights(again)
    assert torch.equal(torch.random.get_rng_state(), rng_before), "default generator moved"
    for (name, a), (_, b) in zip(net.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    mixer = net.mixer
    assert (mixer.A <= -1).all() and (mixer.A >= -16).all()
    dt = torch.nn.functional.softplus(mixer.dt_bias)
    assert (dt >= 1e-3 * 0.999).all() and (dt <= 0.1 * 1.001).all()
    assert (mixer.D == 1).all() and (mixer.norm.weight == 1).all()
    assert ((mixer.conv1d.bias == 0).all() and (mixer.norm.bias == 1).all() is False) or True
    assert math.isclose(mixer.in_proj.weight.std().item(), 1 / 16, rel_tol=0.1)
    assert math.isclose(net.embed_tokens.weight.std().item(), 1.0, rel_tol=0.1)
    model.init_weights(other, seed=5)
    assert not torch.equal(other.mixer.in_proj.weight, mixer.in_proj.weight)


def test_arms() -> None:
    assert ARMS[0] is STOCK and len(BY_NAME) == len(IDENTITY_ARMS) + 2  # + the two floors
    assert all(control.control and control.copy is arms.Copy.STOCK for control in CONTROLS)
    eager = arms.engine_kwargs("/m", GraphMode.EAGER)
    graphs = arms.engine_kwargs("/m", GraphMode.PIECEWISE, seed=3)
    assert eager["enforce_eager"] and "cudagraph_capture_sizes" not in eager
    assert graphs["compilation_config"]["cudagraph_mode"] == "PIECEWISE"
    assert graphs["compilation_config"]["inductor_compile_config"] == {
        "combo_kernels": True,
        "benchmark_combo_kernel": False,
        "deterministic": True,
    }
    autotuned = arms.compilation_config(GraphMode.PIECEWISE, inductor_deterministic=False)
    assert "deterministic" not in autotuned["inductor_compile_config"]
    assert graphs["seed"] == 3 and graphs["cudagraph_capture_sizes"] == [1, 2, 4, 8]
    assert Runner.V2.env == {"VLLM_USE_V2_MODEL_RUNNER": "1"}


def test_worker_environment_lets_the_arm_win() -> None:
    """Every arm gets the shared settings, except where its own env says otherwise."""
    common = dict(sites={"stock": "/s"}, gpu="1", cache_root=Path("/c"))
    shared = arms.DETERMINISTIC_ENV
    stock = client.environment(STOCK, Runner.V2, extra_env=shared, **common)
    own = arms.Arm("own", arms.Copy.STOCK, {"PYTHONHASHSEED": "1"})
    hashed = client.environment(own, Runner.V1, extra_env=shared, **common)
    assert stock["PYTHONHASHSEED"] == "0" and hashed["PYTHONHASHSEED"] == "1"
    assert stock["VLLM_USE_V2_MODEL_RUNNER"] == "1" and stock["CUDA_VISIBLE_DEVICES"] == "1"
    assert stock["TORCHINDUCTOR_DETERMINISTIC"] == hashed["TORCHINDUCTOR_DETERMINISTIC"] == "1"
    assert stock["VLLM_CACHE_ROOT"] == str(Path("/c/stock-v2-gpu1"))
    assert stock["PYTHONPATH"].endswith(os.pathsep + "/s")


def test_prompts_are_fixed_token_ids() -> None:
    first = worker.prompts((3, 700), 32768)
    assert first == worker.prompts((3, 700), 32768)
    assert [len(p) for p in first] == [3, 700]
    assert all(3 <= t < 32768 for p in first for t in p)
    assert len(worker.PROMPT_LENGTHS) == len(worker.ARRIVAL_STEPS) == len(worker.MAX_TOKENS)


def test_one_seed_perturbation_hits_one_call_in_every_n() -> None:
    fake = worker._OneSeedPerturbed(torch, every=4)
    gen = torch.Generator().manual_seed(0)
    draws = [fake.randint(0, 2**32, (1,), generator=gen).item() for _ in range(8)]
    gen.manual_seed(0)
    stock = [torch.randint(0, 2**32, (1,), generator=gen).item() for _ in range(8)]
    assert [d ^ s for d, s in zip(draws, stock, strict=True)] == [1, 0, 0, 0, 1, 0, 0, 0]
    assert fake.int64 is torch.int64


def test_no_draw_hands_out_one_constant_seed() -> None:
    fake = worker._NoDraw(torch)
    first = fake.randint(0, 2**32, (1,), device="cpu")
    assert fake.randint(0, 2**32, (1,), device="cpu") is first and first.tolist() == [0x5EED]
    assert fake.int64 is torch.int64


def test_every_arms_variant_exists() -> None:
    from runner_hooks.drawers import drawer_factory
    from runner_hooks.sync import resolve_sync_plan

    variants = [(a.drawer, a.sync_plan) for a in BY_NAME.values() if a.drawer is not None]
    assert variants == [("kernel", "single"), ("randint", None)]
    for drawer, plan in variants:
        drawer_factory(drawer)
        if plan is not None:
            resolve_sync_plan(plan)
    assert all(a.sync_plan is None for a in BY_NAME.values() if a.drawer is None)
    assert BY_NAME["floor"] in TIMING_ARMS and BY_NAME["floor"] not in IDENTITY_ARMS


def test_worker_protocol(tmp_path: Path) -> None:
    """A worker starts, reports errors as errors, and quits; no vLLM needed."""
    spawned = Worker.spawn(
        STOCK,
        Runner.V1,
        sites={"stock": str(tmp_path)},
        model_dir=tmp_path / "m",
        gpu="",
        log_dir=tmp_path / "logs",
        cache_root=tmp_path / "cache",
        extra_env={"SR_EXTRA": "1"},
    )
    with pytest.raises(WorkerError, match="unknown op 'bogus'"):
        spawned.call("bogus", timeout=60)
    spawned.close()
    assert spawned.process.returncode == 0
    assert "ValueError: unknown op" in spawned.log.read_text()


def test_worker_needs_its_copy(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="names no vLLM for the 'reset' copy"):
        Worker.spawn(
            BY_NAME["reset-kernel"],
            Runner.V1,
            sites={"stock": "/x"},
            model_dir=tmp_path,
            gpu="0",
            log_dir=tmp_path,
            cache_root=tmp_path,
        )


def test_sites_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SR_ENGINE_SITES", raising=False)
    assert sites_from_env() is None
    monkeypatch.setenv("SR_ENGINE_SITES", "stock=/a,reset=/b")
    assert sites_from_env() == {"stock": "/a", "reset": "/b"}
    monkeypatch.setenv("SR_ENGINE_SITES", "stock")
    with pytest.raises(ValueError, match="copy=path"):
        sites_from_env()


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


def _record(fingerprints: list[str], tokens: list[int]) -> dict:
    return {
        "steps": len(fingerprints),
        "decode_steps": len(fingerprints) - 1,
        "fingerprints": fingerprints,
        "state_sha256": fingerprints[-1] * 4,
        "tokens": {"r0": tokens},
        "logprobs": {"r0": [[t, "0x1p-1"] for t in tokens]},
    }


def test_report_compares_and_tabulates() -> None:
    stock = _record(["a" * 64, "b" * 64], [1, 2])
    same = _record(["a" * 64, "b" * 64], [1, 2])
    late = _record(["a" * 64, "c" * 64], [1, 3])
    assert report.first_difference(stock["fingerprints"], late["fingerprints"]) == 1
    assert report.first_difference(["a"], ["a", "b"]) == 1
    assert report.first_difference(["a"], ["a"]) is None
    run = {
        "records": {
            "stock/v1/eager": stock,
            "flag-off/v1/eager": same,
            "reset-kernel/v1/eager": late,
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
    tokens_only = _record(["a" * 64, "b" * 64], [1, 9])
    assert report.compare(report.compact_record(stock), report.compact_record(tokens_only)) == (
        "tokens differ"
    )


def test_report_names_the_first_layer_that_differs() -> None:
    stock = {
        **_record(["a" * 64, "b" * 64], [1, 2]),
        "layer_sums": [["0" * 32, "1" * 32]],
        "slot_sums": [["0" * 16, "1" * 16, "2" * 16]],
    }
    other = {
        **_record(["c" * 64, "b" * 64], [1, 2]),
        "layer_sums": [["0" * 32, "2" * 32]],
        "slot_sums": [["0" * 16, "f" * 16, "2" * 16]],
    }
    assert report.compare(report.compact_record(stock), report.compact_record(other)) == (
        "state differs from step 0 (layer 1 first; slots 1)"
    )
    # No per-layer sums kept for that step: the step alone.
    late = _record(["a" * 64, "c" * 64], [1, 2])
    assert report.compare(report.compact_record(stock), report.compact_record(late)) == (
        "state differs from step 1"
    )


def test_state_digests_leave_out_the_null_block_and_start_from_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gen = torch.Generator().manual_seed(0)
    caches = [
        (torch.randn(4, 3, 2, generator=gen), torch.randn(4, 2, 8, generator=gen).half())
        for _ in range(2)
    ]
    monkeypatch.setattr(worker, "_mamba_caches", lambda net: caches)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(
        worker, "_weights", lambda n, which: torch.arange(n, dtype=torch.int64) * 2 + 1 + which
    )
    sums, sha = worker.layer_sums(None), worker.state_sha256(None)
    caches[1][1][0] += 1  # slot 0, the null block: no request's state
    assert (worker.layer_sums(None), worker.state_sha256(None)) == (sums, sha)
    caches[1][1][2, 1, 3] += 1  # one word of a request's slot in layer 1
    changed = worker.layer_sums(None)
    assert changed[0] == sums[0] and changed[1] != sums[1]
    assert worker.state_sha256(None) != sha
    assert len(worker.slot_sums(None)) == 4  # the per-slot view still shows slot 0
    assert worker.zero_states(None) == 2
    assert all(not tensor.any() for cache in caches for tensor in cache)


def test_sanity_tells_a_degenerate_run() -> None:
    from types import SimpleNamespace as NS

    def final(tokens: list[int], logprobs: list[float]) -> NS:
        steps = zip(tokens, logprobs, strict=True)
        return NS(token_ids=tokens, logprobs=[{t: NS(logprob=v)} for t, v in steps])

    good = {"r0": final([5, 9, 5], [-1.0, -2.5, -0.5]), "r1": final([3, 4], [-3.0, -1.0])}
    assert worker.sanity(good) == {"finite_logprobs": True, "fewest_distinct_tokens": 2}
    nan = {"r0": final([0, 0, 0], [float("nan")] * 3)}
    assert worker.sanity(nan) == {"finite_logprobs": False, "fewest_distinct_tokens": 1}


def test_replay_spans_sum_each_steps_replays() -> None:
    class Pair:
        def __init__(self, ms: float) -> None:
            self.ms = ms

        def elapsed_time(self, end: object) -> float:
            return self.ms

    spans = worker.ReplaySpans()
    spans.pairs.extend((Pair(ms), None) for ms in (1.0, 2.0, 4.0))
    # Step 0 replays once, step 1 not at all (None), step 2 twice.
    assert spans.per_step([1, 1, 3]) == [1e-3, None, 6e-3]


def test_replay_spans_start_behind_a_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start event is recorded after the spin and before the replay, so the
    host's enqueuing of the replay falls inside the spin, not the span."""
    import torch

    calls: list[str] = []

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing

        def record(self) -> None:
            calls.append("record")

    class Graph:
        def replay(self) -> None:
            calls.append("replay")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append(f"spin {cycles}"))
    spans = worker.ReplaySpans()
    spans.install()
    Graph().replay()
    assert calls == [f"spin {worker.SPIN_CYCLES}", "record", "replay", "record"]
    assert len(spans.pairs) == 1


def test_kernels_per_step_reads_torchs_averages() -> None:
    class Average:
        def __init__(self, key: str, count: int, device_us: float) -> None:
            self.key, self.count, self.self_device_time_total = key, count, device_us

    class OldAverage:  # torch before 2.4
        key, count, self_cuda_time_total = "old_kernel", 8, 16.0

    averages = [Average("ssu", 160, 800.0), Average("cpu_only_op", 4, 0.0), OldAverage()]
    assert worker.kernels_per_step(averages, steps=4) == [
        ["ssu", 40.0, 200.0],
        ["old_kernel", 2.0, 4.0],
    ]


class QuickWorker:
    """A worker that answers at once, logging every call into `calls`."""

    def __init__(self, name: str, calls: list[tuple[str, str, dict]]) -> None:
        self.name, self.calls = name, calls

    def call(self, op: str, **args: object) -> dict:
        self.calls.append((self.name, op, args))
        if op == "profile":
            return {"steps": args["steps"], "kernels": [["k", 1.0, 2.0]]}
        return {"start_s": 1.0} if op == "start" else {"step_s": 3e-3}

    def engagement(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def quick_spawn(calls: list[tuple[str, str, dict]]):
    """timing.run's spawn, with a QuickWorker per (arm, runner)."""

    def spawn(pairs, settings, tag, extra_env):
        return {(a.name, r.value): QuickWorker(f"{a.name}/{r.value}", calls) for a, r in pairs}

    return spawn


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
    assert "| stock | - | - | no profile: stock/v1: RuntimeError: CUPTI |" in text


@pytest.mark.parametrize(("value", "sizes"), [("", ()), ("1", (1,)), ("1,8", (1, 8))])
def test_profile_batch_sizes_from_env(value: str, sizes: tuple, monkeypatch) -> None:
    monkeypatch.setenv(session.PROFILE_ENV, value)
    assert session.profile_batch_sizes_from_env() == sizes


@pytest.mark.parametrize("bad", ["3", "one", "1,,8", ","])
def test_a_bad_profile_batch_size_is_refused(bad: str, monkeypatch) -> None:
    monkeypatch.setenv(session.PROFILE_ENV, bad)
    with pytest.raises(ValueError, match="SR_ENGINE_PROFILE takes timed batch sizes"):
        session.profile_batch_sizes_from_env()


def test_profile_markdown_names_the_kernels_an_arm_adds_or_drops() -> None:
    stock = {"1": {"steps": 4, "kernels": [["ssu", 40.0, 200.0], ["randint_kernel", 40.0, 80.0]]}}
    ours = {"1": {"steps": 4, "kernels": [["ssu", 40.0, 200.0], ["stock_seeds_kernel", 1.0, 2.0]]}}
    text = report.profile_markdown({"runners": {"v1": {"profile": {"stock": stock, "x": ours}}}})
    assert "**v1, BS 1: GPU kernels per decode step**" in text
    assert "| stock | 80 | 280.0 | - |" in text
    assert (
        "| x | 41 | 202.0 | `randint_kernel` 0 (0.0 µs) vs 40 (80.0 µs); "
        "`stock_seeds_kernel` 1 (2.0 µs) vs 0 (0.0 µs) |"
    ) in text
    long = report._kernel("void f<" + "x" * 100 + ">(int|char)")
    assert len(long) == report.KERNEL_NAME_CHARS + 2 and long.endswith("…`")


def test_report_cli(tmp_path: Path) -> None:
    identity = tmp_path / "identity.json"
    identity.write_text(json.dumps({"records": {"stock/v1/eager": _record(["a"], [1])}}))
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


class _FakeWorker:
    """Stands in for a Worker: records what it was asked, answers from a script."""

    def __init__(self, name: str, log: list[str], fail_first_start: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail_first_start
        self.closed = False

    def call(self, op: str, **args: object) -> dict:
        self.log.append(f"{self.name} {op} {args.get('mode', '')}".strip())
        if op == "start" and self.fail:
            self.fail = False
            raise WorkerError(f"{self.name}: the worker died")
        if op == "start":
            return {"start_s": 1.0}
        return _record(["a" * 64, self.name.ljust(64, "x")], [1])

    def engagement(self) -> list[str]:
        return [f"line of {self.name}"]

    def close(self) -> None:
        self.closed = True


def test_identity_run_orders_resumes_and_respawns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .identity import MODES, RESUME_ENV, key, run
    from .session import Settings

    log: list[str] = []
    spawned: list[str] = []
    resume = tmp_path / "resume.json"
    done = key("forward-context", Runner.V2, GraphMode.EAGER)
    resume.write_text(
        json.dumps(
            {
                "records": {
                    done: _record(["z" * 64], [9]),
                    key("stock", Runner.V2, GraphMode.EAGER): {"error": "boom"},
                },
                "engagement": {"forward-context/v2": ["old line"]},
            }
        )
    )
    monkeypatch.setenv(RESUME_ENV, str(resume))

    def spawn(pairs, settings, tag, extra_env):
        assert extra_env == arms.IDENTITY_ENV
        out = {}
        for arm, runner in pairs:
            name = f"{arm.name}/{runner.value}"
            again = name in spawned
            spawned.append(name)
            out[arm.name, runner.value] = _FakeWorker(
                name, log, fail_first_start=name == "reset-kernel/v1" and not again
            )
        return out

    settings = Settings(sites={}, gpus=("0",), out=tmp_path / "out")
    data = run(settings, spawn=spawn)
    cells = {key(a.name, r, m) for a in IDENTITY_ARMS for r in Runner for m in MODES}
    assert set(data["records"]) == cells
    # Stock leads every mode: its V1 engine of a mode gives its record before
    # any other engine of that mode starts, and its V2 engine before V2's arms.
    assert log[0] == "stock/v1 start eager"

    def recorded(name: str, mode: GraphMode) -> int:
        started = log.index(f"{name} start {mode.value}")
        return log.index(f"{name} identity", started)

    for mode in MODES:
        starts = {line.split()[0]: i for i, line in enumerate(log) if line.endswith(mode.value)}
        assert all(i > recorded("stock/v1", mode) for n, i in starts.items() if n != "stock/v1")
        v2_arms = [i for n, i in starts.items() if n.endswith("/v2") and n != "stock/v2"]
        assert v2_arms and all(i > recorded("stock/v2", mode) for i in v2_arms), (mode, log)
    # A recorded cell is kept, not run again; a cell that failed before runs again.
    assert data["records"][done]["fingerprints"] == ["z" * 64]
    assert "forward-context/v2 start eager" not in log
    assert "stock/v2 start eager" in log
    # A worker that dies is replaced once, and its cell then has a record.
    assert spawned.count("reset-kernel/v1") == 2
    failed = [c for c, r in data["records"].items() if "error" in r]
    assert failed == [], failed
    saved = json.loads((tmp_path / "out" / "identity.json").read_text())
    assert saved["records"] == json.loads(resume.read_text())["records"] == data["records"]
    assert data["engagement"]["stock/v1"] == ["line of stock/v1"]
    # Saved with each record, so a run cut off before its workers close has them.
    assert json.loads(resume.read_text())["engagement"]["forward-context/v2"] == [
        "line of forward-context/v2"
    ]


def test_reproduce_runs_stock_twice_per_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from . import reproduce
    from .session import Settings

    events: list[str] = []

    class Stock:
        def __init__(self, root: Path, env: dict[str, str]) -> None:
            self.root, self.env = root, env

        def call(self, op: str, **args: object) -> dict:
            events.append(f"{self.root} {op}")
            if op == "start":
                assert args["mode"] == "PIECEWISE"
                return {"start_s": 1.0}
            # Processes with a compile cache of their own compute their own bits.
            bits = self.root.name  # the process number
            return _record([bits.ljust(64, "x")], [1])

        def close(self) -> None:
            events.append(f"{self.root} close")

    def spawn(arm, runner, *, cache_root, extra_env, **_: object) -> Stock:
        assert (arm, runner) == (STOCK, Runner.V1)
        assert extra_env.items() >= arms.DETERMINISTIC_ENV.items()
        return Stock(cache_root, extra_env)

    monkeypatch.setattr(reproduce.Worker, "spawn", spawn)
    monkeypatch.setattr(Settings, "write_model", lambda self: tmp_path / "model")
    settings = Settings(sites={}, gpus=("0", "1"), out=tmp_path)
    by_name = {v.name: v for v in reproduce.VARIANTS}
    apart = reproduce.run_variant(by_name["as-run"], settings, "1")
    assert apart["verdict"].startswith("state differs from step 0") and apart["gpu"] == "1"
    # Two processes, each on a compile cache of its own, each started, run and closed.
    roots = [reproduce.ROOT / "as-run" / str(process) for process in (0, 1)]
    ops = ("start", "identity", "close")
    assert sorted(events) == sorted(f"{root} {op}" for root in roots for op in ops)
    assert by_name["torch-deterministic"].env.items() <= arms.IDENTITY_ENV.items()
    tuned = json.loads(by_name["reductions-tuned"].env[worker.LLM_KWARGS_ENV])
    assert "deterministic" not in tuned["compilation_config"]["inductor_compile_config"]


def test_timing_run_measures_runners_in_turn(tmp_path: Path) -> None:
    from .session import Settings

    log: list[str] = []

    class Timed(_FakeWorker):
        def call(self, op: str, **args: object) -> dict:
            self.log.append(f"{self.name} {op}")
            if op == "start" and self.fail:
                raise WorkerError(f"{self.name}: no kernel")
            if op == "start":
                return {"start_s": 1.0}
            saved = 1e-4 if self.name.startswith("reset-kernel") else 0.0
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
    row = data["runners"]["v2"]["summary"]["forward"]["8"]["reset-kernel"]
    assert row["saved_us"] == pytest.approx(100.0) and row["samples"] == 10
    assert "forward-context" not in data["runners"]["v1"]["summary"]["step"]["1"]
    assert json.loads((tmp_path / "timing.json").read_text())["plan"]["rounds"] == 10
    assert set(workers) == {(a.name, r.value) for a in TIMING_ARMS for r in Runner}


def test_microbench_predictions_follow_each_arms_variant() -> None:
    summary = [
        {"variant": v, "mode": m, "batch_size": 1, "median_us": us}
        for v, m, us in (
            ("stock", "graph", 245.0),
            ("explicit-current_stream-kernel", "graph", 175.0),
            ("baseline", "graph", 181.0),
            ("explicit-current_stream-kernel", "eager", 1.0),
        )
    ]
    predicted = report.predictions(summary)
    assert predicted["reset-kernel", 1] == 70.0 and predicted["forward-context", 1] == 64.0
    assert predicted["flag-off", 1] == 0.0 and ("reset-randint", 1) not in predicted


@pytest.mark.parametrize(
    "script",
    ["engine.sh", "patched_installed.sh", "bundle-0.20.sh", "stage-0.20.sh", "identity-0.20.sh"],
)
def test_gpu_machine_scripts_parse(script: str) -> None:
    path = Path(__file__).resolve().parents[2] / "tests" / "gpu" / "vllm" / script
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_the_timing_can_measure_one_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(session.RUNNERS_ENV, "v2")
    assert session.runners_from_env() == (Runner.V2,)
    calls: list[tuple[str, str, dict]] = []
    settings = session.Settings({}, ("0", "1"), tmp_path, session.runners_from_env())
    plan = timing.Plan(rounds=2, batch_sizes=(1,))
    data, _ = timing.run(settings, plan, spawn=quick_spawn(calls))
    assert list(data["runners"]) == ["v2"]
    assert calls and all(name.endswith("/v2") for name, _, _ in calls)


def test_the_timing_can_measure_some_arms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(session.ARMS_ENV, "reset-kernel-single,floor")
    chosen = [arm.name for arm in session.timing_arms_from_env()]
    assert chosen == ["stock", "reset-kernel-single", "floor"]  # stock always, in order
    monkeypatch.delenv(session.ARMS_ENV)
    assert session.timing_arms_from_env() == TIMING_ARMS


@pytest.mark.parametrize("bad", ["reset", ",", "stock,control-one-seed"])
def test_an_unknown_timing_arm_is_refused(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(session.ARMS_ENV, bad)
    with pytest.raises(ValueError, match="SR_ENGINE_ARMS takes names among"):
        session.timing_arms_from_env()


def test_the_identity_run_can_judge_some_arms_and_modes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(session.IDENTITY_ARMS_ENV, "control-one-seed,reset-kernel")
    monkeypatch.setenv(session.MODES_ENV, "FULL_AND_PIECEWISE,eager")
    chosen = [arm.name for arm in session.identity_arms_from_env()]
    # stock and its positive control always, in IDENTITY_ARMS' order
    assert chosen == ["stock", "stock-again", "reset-kernel", "control-one-seed"]
    assert session.modes_from_env(identity.MODES) == (
        GraphMode.EAGER,
        GraphMode.FULL_AND_PIECEWISE,
    )
    calls: list[tuple[str, str, dict]] = []
    settings = session.Settings({}, ("0",), tmp_path)
    records = identity.run(settings, spawn=quick_spawn(calls))["records"]
    assert sorted(records) == sorted(
        identity.key(arm, runner, mode)
        for arm in chosen
        for runner in Runner
        for mode in (GraphMode.EAGER, GraphMode.FULL_AND_PIECEWISE)
    )
    monkeypatch.delenv(session.IDENTITY_ARMS_ENV)
    monkeypatch.delenv(session.MODES_ENV)
    assert session.identity_arms_from_env() == IDENTITY_ARMS
    assert session.modes_from_env(identity.MODES) == identity.MODES


@pytest.mark.parametrize(
    ("env", "bad"),
    [("IDENTITY_ARMS_ENV", "reset"), ("IDENTITY_ARMS_ENV", ","), ("MODES_ENV", "FULL")],
)
def test_an_unknown_identity_arm_or_mode_is_refused(
    env: str, bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = getattr(session, env)
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=f"{name} takes names among"):
        session.identity_arms_from_env()
        session.modes_from_env(identity.MODES)


@pytest.mark.parametrize("bad", ["v3", ",", "v1,x"])
def test_an_unknown_runner_is_refused(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(session.RUNNERS_ENV, bad)
    with pytest.raises(ValueError, match="SR_ENGINE_RUNNERS takes"):
        session.runners_from_env()


@pytest.mark.parametrize(
    ("version", "runners"),
    [("0.20.0", (Runner.V1,)), ("0.22.1", (Runner.V1,)), ("0.23.0", tuple(Runner)),
     ("0.26.0", tuple(Runner)), ("0.33.0", tuple(Runner)), (None, tuple(Runner))],
)  # fmt: skip
def test_the_runners_default_to_those_the_vllm_release_serves_the_model_with(
    version: str | None, runners: tuple[Runner, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM before 0.23.0 refuses hybrid models under its V2 runner: V1 alone, and
    naming V2 is refused before any engine starts; later (or unknown) releases run both."""
    monkeypatch.delenv(session.RUNNERS_ENV, raising=False)
    assert session.runners_from_env(version) == runners
    monkeypatch.setenv(session.RUNNERS_ENV, "v1")
    assert session.runners_from_env(version) == (Runner.V1,)
    monkeypatch.setenv(session.RUNNERS_ENV, "v1,v2")
    if Runner.V2 in runners:
        assert session.runners_from_env(version) == (Runner.V1, Runner.V2)
    else:
        with pytest.raises(ValueError, match=f"vLLM {version}'s V2 model runner refuses"):
            session.runners_from_env(version)


def test_the_stock_copy_s_vllm_version_picks_the_runners_and_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site-0.20.0"
    (site / "vllm-0.20.0.dist-info").mkdir(parents=True)
    (site / "vllm-0.20.0.dist-info" / "METADATA").write_text("Name: vllm\nVersion: 0.20.0\n")
    (site / "vllm").mkdir()
    assert session.site_vllm_version(str(site)) == "0.20.0"
    assert session.site_vllm_version(str(site / "vllm")) is None
    assert session.site_vllm_version(None) is None
    monkeypatch.setenv(client.SITES_ENV, f"stock={site},reset={tmp_path / 'r'}")
    monkeypatch.delenv(session.RUNNERS_ENV, raising=False)
    for env in (session.IDENTITY_ARMS_ENV, session.MODES_ENV, identity.RESUME_ENV):
        monkeypatch.delenv(env, raising=False)
    settings = session.Settings.from_env()
    assert settings is not None and settings.runners == (Runner.V1,)
    settings = session.Settings(settings.sites, ("0",), tmp_path / "out", settings.runners)
    calls: list[tuple[str, str, dict]] = []
    data = identity.run(settings, spawn=quick_spawn(calls))
    assert data["vllm"] == "0.20.0"
    assert json.loads((tmp_path / "out" / "identity.json").read_text())["vllm"] == "0.20.0"
    assert calls and all(name.endswith("/v1") for name, _, _ in calls)


def test_the_fork_script_checks_every_file_the_patch_changes() -> None:
    """patched_installed.sh hashes the installed files before apply and after
    revert: every file the patch edits must be among them."""
    import re

    from vllm_patch import releases
    from vllm_patch.targets import cmake_lists, paths, setup_py

    script = Path(__file__).resolve().parents[2] / "tests" / "gpu" / "vllm" / "patched_installed.sh"
    listed = re.search(r"^files=\(([^)]*)\)", script.read_text(), re.MULTILINE)
    assert listed is not None
    # A wheel has no setup.py or CMakeLists.txt.
    installed = set(paths(releases.get("0.26.0"))) - {setup_py.PATH, cmake_lists.PATH}
    assert set(listed.group(1).split()) == installed


def judged(records: str | Path, *pytest_args: str) -> tuple[dict[str, str], str]:
    """The identity test run on a records file (SR_ENGINE_RECORDS), with
    `pytest_args` (a -k selection): each test id's verdict, and its output."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"),
            *pytest_args,
            "tests/gpu/vllm/test_engine_identity.py",
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
    cells = [f"{runner}-{mode.value}" for runner in ("v1", "v2") for mode in arms.GraphMode]
    expected = {
        f"{test}[{cell}]"
        for cell in cells
        for test in ("test_stock_is_reproducible", "test_stock_is_not_degenerate")
    }
    expected |= {
        f"test_identical_to_stock[{arm.name}-{cell}]"
        for arm in arms.IDENTITY_ARMS
        if not arm.control and arm.name not in ("stock", "stock-again")
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


# Runs of the landing as it is now, the README quoting each: the records, the runners,
# and per group of cells judged (mode[-serving]) the patched arms run in them; the
# one-seed control runs in every cell.
BOTH = ("v1", "v2")
LANDING_RUNS = {
    "bench/results/engine-nvidia-h200-20261201d-plain": (
        BOTH,
        [(["eager", "FULL_AND_PIECEWISE"], ["reset-kernel", "forward-context"])],
    ),
    "bench/results/engine-nvidia-h200-20261201d-serving": (
        BOTH,
        [
            (
                [f"FULL_AND_PIECEWISE-{s}" for s in ("mtp3", "mtp7", "prefix", "seed-serving")],
                ["reset-kernel"],
            )
        ],
    ),
    # vLLM 0.20.0, whose V2 runner refuses hybrid models.
    "bench/results/engine-nvidia-h200-20261202-vllm020": (
        ("v1",),
        [
            (["eager", "FULL_AND_PIECEWISE"], ["reset-kernel", "forward-context"]),
            (["FULL_AND_PIECEWISE-seed-serving"], ["reset-kernel"]),
        ],
    ),
}


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
            "test_serving_options_took_effect",
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
    assert verdicts == dict.fromkeys(expected, "PASSED"), output[-3000:]


# Tensor parallelism: the harness's per-rank plumbing, with fakes for vLLM.


def test_model_config_gives_every_rank_one_tp4_ranks_work() -> None:
    super_ = model.SUPER
    for tp in model.TP_SIZES:
        config = model.model_config(tp)
        assert config["hybrid_override_pattern"] == model.model_config()["hybrid_override_pattern"]
        per_rank = {
            name: config[name] // tp
            for name in ("mamba_num_heads", "n_groups", "num_attention_heads", "vocab_size")
        }
        assert per_rank == {
            "mamba_num_heads": 32,
            "n_groups": 2,
            "num_attention_heads": 8,
            "vocab_size": 32768,
        }
        assert config["intermediate_size"] // tp == 1344 and config["mamba_n_groups"] == 2 * tp
        kv = config["num_key_value_heads"]
        assert (kv // tp if tp <= kv else tp % kv) == (1 if tp <= kv else 0)  # one head per rank
        assert (config["mamba_head_dim"], config["ssm_state_size"]) == (64, 128)
    full = model.model_config(4)
    assert (full["mamba_num_heads"], full["n_groups"]) == (super_["mamba_num_heads"], 8)
    assert (full["num_attention_heads"], full["num_key_value_heads"]) == (32, 2)
    assert (full["vocab_size"], full["intermediate_size"]) == (131072, 5376)
    with pytest.raises(ValueError, match=r"splits over \(1, 2, 4, 8\) ranks; got .* size 3"):
        model.model_config(3)


@pytest.mark.parametrize(("value", "tp"), [(None, 1), ("", 1), ("1", 1), ("2", 2), (" 4 ", 4)])
def test_tp_from_env(value: str | None, tp: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if value is None:
        monkeypatch.delenv(session.TP_ENV, raising=False)
    else:
        monkeypatch.setenv(session.TP_ENV, value)
    assert session.tp_from_env() == tp


@pytest.mark.parametrize("bad", ["0", "3", "16", "two", "-2", "2.0", "2,4"])
def test_a_bad_tp_is_refused(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(session.TP_ENV, bad)
    with pytest.raises(ValueError, match=r"SR_ENGINE_TP takes a tensor-parallel size among 1, 2"):
        session.tp_from_env()


def test_each_runner_gets_a_group_of_tp_gpus(tmp_path: Path, monkeypatch) -> None:
    def gpus(names: tuple[str, ...], tp: int) -> list[str]:
        settings = session.Settings({}, names, tmp_path, tp=tp)
        return [settings.gpu(runner) for runner in Runner]

    assert gpus(("0", "1"), 1) == ["0", "1"]  # as before TP
    assert gpus(("0",), 1) == ["0", "0"]
    assert gpus(("0", "1"), 2) == ["0,1", "0,1"]
    assert gpus(("0", "1", "2", "3"), 2) == ["0,1", "2,3"]
    assert gpus(("0", "1", "2"), 2) == ["0,1", "0,1"]
    assert gpus(("0", "1", "2", "3"), 4) == ["0,1,2,3"] * 2
    with pytest.raises(ValueError, match="SR_ENGINE_TP=2 needs 2 GPUs per engine; SR_ENGINE_GPUS"):
        session.Settings({}, ("0",), tmp_path, tp=2)
    monkeypatch.setenv("SR_ENGINE_SITES", "stock=/s")
    monkeypatch.setenv(session.GPUS_ENV, "0,1")
    monkeypatch.setenv(session.TP_ENV, "2")
    settings = session.Settings.from_env()
    assert settings is not None and settings.tp == 2
    # Every engine is spawned with the TP size.
    spawned: list[dict] = []
    monkeypatch.setattr(session.Worker, "spawn", lambda arm, runner, **kw: spawned.append(kw))
    monkeypatch.setattr(session.Settings, "write_model", lambda self: tmp_path / "m")
    session.spawn_all([(STOCK, Runner.V1), (STOCK, Runner.V2)], settings, "t")
    assert [(kw["tp"], kw["gpu"]) for kw in spawned] == [(2, "0,1"), (2, "0,1")]


def test_engine_kwargs_at_tp() -> None:
    single = arms.engine_kwargs("/m", GraphMode.EAGER)
    assert single["tensor_parallel_size"] == 1 and "distributed_executor_backend" not in single
    two = arms.engine_kwargs("/m", GraphMode.FULL_AND_PIECEWISE, tp=2)
    assert two["tensor_parallel_size"] == 2 and two["distributed_executor_backend"] == "mp"
    assert single["worker_cls"] == two["worker_cls"] == arms.WORKER_CLS
    module, name = arms.WORKER_CLS.rsplit(".", 1)
    source = Path(__file__).resolve().parents[2] / (module.replace(".", "/") + ".py")
    assert f"class {name}(Worker):" in source.read_text()


def test_every_engine_has_multicast_off_and_its_ranks_gpus(monkeypatch) -> None:
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # the caller's, which must not reach a rank
    common = dict(sites={"reset": "/r"}, cache_root=Path("/c"))
    arm = BY_NAME["reset-kernel"]
    two = client.environment(arm, Runner.V1, gpu="0,1", extra_env=arms.IDENTITY_ENV, **common)
    one = client.environment(arm, Runner.V1, gpu="1", **common)
    for env in (one, two):
        assert {k: env[k] for k in arms.MULTICAST_OFF_ENV} == {
            "NCCL_NVLS_ENABLE": "0",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1",
        }
        assert env.items() >= arm.env.items() and env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert two["CUDA_VISIBLE_DEVICES"] == "0,1" and two["SR_ENGINE_TORCH_DETERMINISTIC"] == "1"
    assert two["VLLM_CACHE_ROOT"] == str(Path("/c/reset-kernel-v1-gpu0-1"))
    assert one["VLLM_CACHE_ROOT"] == str(Path("/c/reset-kernel-v1-gpu1"))  # as before TP


def test_replies_are_put_in_rank_order() -> None:
    assert worker.by_rank([(1, "b"), (0, "a")], 2) == ["a", "b"]
    assert worker.by_rank([(0, "a")], 1) == ["a"]
    for replies in ([(0, "a")], [(0, "a"), (0, "b")], [(1, "a"), (2, "b")]):
        with pytest.raises(worker.RankError, match=r"one reply from each of ranks 0\.\.1"):
            worker.by_rank(replies, 2)


def test_rank_calls_reach_each_ranks_worker_and_model() -> None:
    from types import SimpleNamespace as NS

    rank1 = NS(rank=1, get_model=lambda: "model of rank 1")
    assert worker._on_rank(rank1, worker._on_model, lambda net: net.upper()) == (
        1,
        "MODEL OF RANK 1",
    )
    assert worker._on_rank(rank1, lambda w, x: (w.rank, x), 7) == (1, (1, 7))


def test_merged_spans_take_the_slowest_rank_of_each_forward() -> None:
    ranks = [
        {"forward_s": [1.0, 2.0, 3.0], "replay_s": [1.0, None, 3.0], "replays": 2},
        {"forward_s": [2.0, 1.0, 3.0], "replay_s": [1.5, None, 2.0], "replays": 2},
    ]
    merged = worker.merge_spans(ranks)
    assert merged == {
        "forward_s": 2.0,  # median of 2, 2, 3
        "forwards": 3,
        "replay_s": 2.25,  # median of 1.5, 3.0: forward 1 replayed nothing
        "replay_spread_s": 0.75,  # median of 0.5, 1.0
        "rank_replay_s": [2.0, 1.75],
    }
    with pytest.raises(worker.RankError, match=r"different numbers of forwards: \[3, 2\]"):
        worker.merge_spans([ranks[0], {"forward_s": [1.0, 2.0], "replay_s": [None, None]}])


def test_merged_spans_of_one_rank_are_its_own() -> None:
    """TP 1 as before: the median forward, and the median replay of the forwards that replayed."""
    one = {"forward_s": [3e-3, 1e-3, 2e-3, 5e-3], "replay_s": [1e-3, None, 4e-3, 2e-3]}
    merged = worker.merge_spans([one])
    assert merged["forward_s"] == 2.5e-3 and merged["forwards"] == 4
    assert merged["replay_s"] == 2e-3 and merged["replay_spread_s"] == 0.0
    assert merged["rank_replay_s"] == [2e-3]


def test_rank_spans_split_replays_by_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace as NS

    clock = [0.0]

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.at = 0.0

        def record(self) -> None:
            clock[0] += 1.0
            self.at = clock[0]

        def elapsed_time(self, end: Event) -> float:
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    replays = worker.ReplaySpans()

    def execute_model(graphs: int) -> str:
        for _ in range(graphs):  # as the wrapped CUDAGraph.replay records
            start, end = Event(), Event()
            start.record()
            end.record()
            replays.pairs.append((start, end))
        return "output"

    runner = NS(execute_model=execute_model)
    spans = worker.RankSpans(replays)
    spans.install(NS(model_runner=runner))
    assert [runner.execute_model(n) for n in (1, 0, 2)] == ["output"] * 3
    taken = spans.take()
    assert taken["replays"] == 3 and len(taken["forward_s"]) == 3
    assert taken["replay_s"] == [1e-3, None, 2e-3]
    assert spans.take() == {"forward_s": [], "replay_s": [], "replays": 0}


class _RankedEngine:
    """An LLMEngine over `tp` fake ranks: collective_rpc runs the function on
    each rank's worker (in reverse rank order), requests get one token a step."""

    def __init__(self, tp: int) -> None:
        from types import SimpleNamespace as NS

        self.workers = [NS(rank=r, get_model=lambda r=r: f"net{r}") for r in range(tp)]
        self.steps = 0
        self.running: dict[str, list[int]] = {}
        self.prompts: dict[str, list[int]] = {}
        self.vllm_config = NS(cache_config=NS(block_size=64))
        self.log_stats = False

    def collective_rpc(self, method, args=()):
        return [method(w, *args) for w in reversed(self.workers)]

    def add_request(self, rid: str, prompt: dict, params: object) -> None:
        self.running[rid] = []
        self.prompts[rid] = prompt["prompt_token_ids"]

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self) -> list:
        from types import SimpleNamespace as NS

        self.steps += 1
        outs = []
        for rid, tokens in list(self.running.items()):
            tokens.append(self.steps % 7 + 3)
            logprobs = [{t: NS(logprob=-1.0)} for t in tokens]
            completion = NS(token_ids=list(tokens), logprobs=logprobs)
            # A prompt that starts with a block seen before "hits" that block.
            seen = any(
                other != rid and self.prompts[other][:64] == self.prompts[rid][:64]
                for other in self.prompts
            )
            cached = 64 if seen and len(self.prompts[rid]) > 64 else 0
            outs.append(NS(request_id=rid, outputs=[completion], num_cached_tokens=cached))
            if len(tokens) == 3:
                del self.running[rid]
        return outs


def test_identity_record_holds_every_ranks_state(monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    fake = _RankedEngine(tp=2)

    def digest(*parts: object) -> str:
        return hashlib.sha256(repr(parts).encode()).hexdigest()

    monkeypatch.setattr(worker, "zero_states", lambda net: 40)
    monkeypatch.setattr(worker, "layer_sums", lambda net: [digest(net, fake.steps)[:32]] * 2)
    monkeypatch.setattr(worker, "slot_sums", lambda net: [digest(net, "slot")[:16]])
    monkeypatch.setattr(worker, "rng_offset", lambda net: 4 * fake.steps + int(net[-1]))
    monkeypatch.setattr(worker, "state_sha256", lambda net: digest(net))
    monkeypatch.setattr(worker.Engine, "_params", lambda self, max_tokens, logprobs: None)
    engine = worker.Engine(STOCK, "/m", tp=2)
    engine.llm = type("LLM", (), {"llm_engine": fake})()
    got = engine.identity()
    assert got["tp"] == 2 and [state["rank"] for state in got["ranks"]] == [0, 1]
    for rank, state in enumerate(got["ranks"]):
        assert len(state["fingerprints"]) == got["steps"] == fake.steps
        first = worker.state_fingerprint([digest(f"net{rank}", 1)[:32]] * 2)
        assert state["fingerprints"][0] == first
        assert len(state["layer_sums"]) == len(state["slot_sums"]) == worker.LAYER_STEPS
        assert state["rng_offsets"] == [4 * step + rank for step in range(worker.LAYER_STEPS + 1)]
        assert state["state_sha256"] == digest(f"net{rank}")
    assert got["ranks"][0]["fingerprints"] != got["ranks"][1]["fingerprints"]
    assert set(got["tokens"]) == {f"r{i}" for i in range(len(worker.PROMPT_LENGTHS))}
    # The report's compact form keeps each rank's state, with its rank.
    compact = report.compact_record(got)
    assert compact["tp"] == 2 and [s["rank"] for s in compact["ranks"]] == [0, 1]
    assert report.compare(compact, report.compact_record(got)) == "identical"
    other = json.loads(json.dumps(got))
    other["ranks"][1]["fingerprints"][5] = "f" * 64
    assert report.compare(got, other) == "rank 1: state differs from step 5"
    other["ranks"][0]["state_sha256"] = "0" * 64
    assert report.compare(got, other) == "rank 0: state differ; rank 1: state differs from step 5"
    assert report.compare(got, {**got, "ranks": got["ranks"][:1]}).startswith("ranks [0] against")


def test_a_record_of_a_run_before_tp_is_rank_0s() -> None:
    flat = _record(["a" * 64, "b" * 64], [1, 2])
    (state,) = report.rank_states(flat)
    assert state["rank"] == 0 and state["fingerprints"] == flat["fingerprints"]
    compact = report.compact_record(flat)
    assert compact["tp"] == 1 and compact["ranks"][0]["fingerprints"] == ["a" * 16, "b" * 16]
    # Judged as before TP: the verdicts name no rank.
    again = report.compact_record(_record(["a" * 64, "b" * 64], [1, 2]))
    assert report.compare(compact, again) == "identical"
    late = report.compact_record(_record(["a" * 64, "c" * 64], [1, 2]))
    assert report.compare(compact, late) == "state differs from step 1"


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
    assert verdicts["test_identical_to_stock[reset-kernel-v1-eager]"] == "PASSED"
    assert verdicts["test_negative_control_differs[control-generator-seed-v1-eager]"] == "PASSED"
    assert verdicts["test_stock_is_reproducible[v1-eager]"] == "PASSED"
    assert "rank 0: the state does not differ" not in output  # rank 1's is the one
    assert "rank 1: the state does not differ" in output
    assert "{1: 30}" in output


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


def test_timing_run_records_its_tp(tmp_path: Path) -> None:
    settings = session.Settings({}, ("0", "1"), tmp_path, (Runner.V1,), tp=2)
    data, _ = timing.run(settings, timing.Plan(rounds=2, batch_sizes=(1,)), spawn=quick_spawn([]))
    assert data["tp"] == 2 and json.loads((tmp_path / "timing.json").read_text())["tp"] == 2


FAKE_VLLM = {
    "vllm/__init__.py": '''
import json, multiprocessing, os
from importlib import import_module

KEYS = json.loads(os.environ["FAKE_KEYS"])


def _rank(worker_cls, rank, out):
    module, name = worker_cls.rsplit(".", 1)
    getattr(import_module(module), name)(rank=rank)
    from vllm.model_executor.layers.mamba.ops import ssu_dispatch
    seen = {
        "env": {key: os.environ.get(key) for key in KEYS},
        "ssu_torch": type(ssu_dispatch.torch).__name__,
        "prefetcher": getattr(ssu_dispatch.SRSeedPrefetcher, "keywords", None),
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)


class _Engine:
    def __init__(self, tp):
        self.tp = tp

    def collective_rpc(self, method, args=()):
        return [(rank, 0) for rank in range(self.tp)]


class LLM:
    """Starts a process per rank, as vLLM's multiprocessing executor does
    (spawned: a rank has only what its environment says)."""

    def __init__(self, **kwargs):
        out = os.environ["FAKE_OUT"]
        with open(os.path.join(out, "kwargs.json"), "w") as f:
            json.dump(kwargs, f)
        tp = kwargs["tensor_parallel_size"]
        context = multiprocessing.get_context("spawn")
        ranks = [
            context.Process(target=_rank, args=(kwargs["worker_cls"], rank, out))
            for rank in range(tp)
        ]
        for process in ranks:
            process.start()
        for process in ranks:
            process.join()
            assert process.exitcode == 0, process.exitcode
        self.llm_engine = _Engine(tp)
''',
    "vllm/v1/worker/gpu_worker.py": """
class Worker:
    def __init__(self, rank):
        self.rank = rank
""",
    "vllm/model_executor/layers/mamba/ops/ssu_dispatch.py": (
        "torch = None\nSRSeedPrefetcher = None\n"
    ),
    "vllm/distributed/parallel_state.py": "def cleanup_dist_env_and_memory():\n    pass\n",
}


@pytest.mark.parametrize("arm", ["control-one-seed", "reset-kernel-single"])
def test_each_rank_process_gets_the_arms_environment(arm: str, tmp_path: Path) -> None:
    """A real worker process starts an engine at TP 2 whose ranks are spawned
    processes (a fake vLLM): each rank has NVLink multicast off, the arm's own
    variables and its GPUs, and is set up for the arm (the control's seed path,
    the variant's drawer and plan) before its model would load."""
    site = tmp_path / "site"
    for name, text in FAKE_VLLM.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    chosen = BY_NAME[arm]
    keys = [*arms.MULTICAST_OFF_ENV, *chosen.env, "SR_ENGINE_ARM", "CUDA_VISIBLE_DEVICES"]
    keys.append("PYTHONHASHSEED")
    spawned = Worker.spawn(
        chosen,
        Runner.V1,
        sites={chosen.copy.value: str(site)},
        model_dir=tmp_path / "m",
        gpu="0,1",
        log_dir=tmp_path / "logs",
        cache_root=tmp_path / "cache",
        extra_env={
            **arms.DETERMINISTIC_ENV,
            "FAKE_OUT": str(tmp_path),
            "FAKE_KEYS": json.dumps(keys),
            "NCCL_NVLS_ENABLE": "1",
        },
        tp=2,
    )
    try:
        assert spawned.call("start", mode="eager", timeout=240)["parameters"] == 0
    finally:
        spawned.close()
    kwargs = json.loads((tmp_path / "kwargs.json").read_text())
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["distributed_executor_backend"] == "mp"
    assert kwargs["worker_cls"] == arms.WORKER_CLS
    expected_env = {
        **arms.MULTICAST_OFF_ENV,
        **chosen.env,
        "SR_ENGINE_ARM": arm,
        "CUDA_VISIBLE_DEVICES": "0,1",
        "PYTHONHASHSEED": "0",
    }
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["env"] == expected_env, rank
        perturbed = "_OneSeedPerturbed" if arm == "control-one-seed" else "NoneType"
        assert seen["ssu_torch"] == perturbed, rank
        variant = {"drawer": chosen.drawer, "sync_plan": chosen.sync_plan}
        assert seen["prefetcher"] == (variant if chosen.drawer else None), rank


# Serving configurations: MTP, async scheduling, prefix caching.


def test_plain_serving_adds_nothing_and_the_others_their_options() -> None:
    compiled = GraphMode.FULL_AND_PIECEWISE
    plain = arms.engine_kwargs("/m", compiled)
    assert plain == arms.engine_kwargs("/m", compiled, serving=arms.PLAIN)
    assert not {"speculative_config", "async_scheduling", "enable_prefix_caching"} & set(plain)
    by = arms.SERVING_BY_NAME
    mtp7 = arms.engine_kwargs("/m", compiled, serving=by["mtp7"])
    assert mtp7["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 7}
    # Graphs per token count of a verify step: BS x (1 + K).
    assert mtp7["cudagraph_capture_sizes"] == [8, 16, 32, 64]
    assert arms.engine_kwargs("/m", compiled, serving=by["mtp3"])["cudagraph_capture_sizes"] == [
        4,
        8,
        16,
        32,
    ]
    assert "cudagraph_capture_sizes" not in arms.engine_kwargs(
        "/m", GraphMode.EAGER, serving=by["mtp3"]
    )
    assert arms.engine_kwargs("/m", compiled, serving=by["sync"])["async_scheduling"] is False
    prefix = arms.engine_kwargs("/m", compiled, serving=by["prefix"])
    assert prefix["enable_prefix_caching"] and prefix["mamba_cache_mode"] == "align"
    assert prefix["enable_chunked_prefill"]
    seed = arms.engine_kwargs("/m", compiled, serving=by["seed-serving"])
    assert seed["speculative_config"]["num_speculative_tokens"] == 7
    assert seed["mamba_cache_mode"] == "align" and "async_scheduling" not in seed
    # Every serving but plain logs stats (the record's counters).
    for serving in arms.SERVINGS[1:]:
        assert arms.engine_kwargs("/m", compiled, serving=serving)["disable_log_stats"] is False


@pytest.mark.parametrize("k", [0, 3, 7])
def test_align_mode_batches_hold_a_block(k: int) -> None:
    """max_num_batched_tokens under prefix caching holds the attention block
    that vLLM 0.26.0 sizes to one Mamba state (Platform._align_hybrid_block_size:
    TRITON_ATTN's 16-token alignment; the conv state holds K more columns under
    MTP), and the identity workload's longest shared-prefix prompt fits."""
    config = model.model_config()
    conv_dim = config["mamba_num_heads"] * config["mamba_head_dim"] + 2 * (
        config["n_groups"] * config["ssm_state_size"]
    )
    conv_bytes = (config["conv_kernel"] - 1 + k) * conv_dim * 2  # bf16
    ssm_bytes = config["mamba_num_heads"] * config["mamba_head_dim"] * config["ssm_state_size"] * 2
    token_bytes = 2 * config["num_key_value_heads"] * config["head_dim"] * 2
    block = 16 * math.ceil((conv_bytes + ssm_bytes) / (16 * token_bytes))
    assert 1000 < block <= arms.PREFIX_MAX_NUM_BATCHED_TOKENS
    longest = int(block * worker.SHARED_PREFIX_BLOCKS) + max(
        worker.PROMPT_LENGTHS[i] + worker.MAX_TOKENS[i] for i in worker.SHARED_PREFIX_REQUESTS
    )
    assert longest + k <= arms.PREFIX_MAX_MODEL_LEN <= config["max_position_embeddings"]


def test_the_mtp_model_dir_adds_one_attention_mtp_layer(tmp_path: Path) -> None:
    folder = model.write_model_dir(tmp_path / "m")
    mtp = json.loads((model.mtp_model_dir(folder) / "config.json").read_text())
    assert model.mtp_model_dir(folder) == tmp_path / "m-mtp"
    assert mtp["num_nextn_predict_layers"] == 1 and mtp["mtp_hybrid_override_pattern"] == "*"
    assert {k: v for k, v in mtp.items() if k != "mtp_hybrid_override_pattern"} == {
        **model.model_config(),
        "num_nextn_predict_layers": 1,
    }


def test_servings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert session.servings_from_env() == (arms.PLAIN,)
    monkeypatch.setenv(session.SERVING_ENV, "seed-serving,mtp3")
    assert [s.name for s in session.servings_from_env()] == ["mtp3", "seed-serving"]
    monkeypatch.setenv(session.SERVING_ENV, "mtp5")
    with pytest.raises(ValueError, match="SR_ENGINE_SERVING takes names among"):
        session.servings_from_env()


def test_the_identity_run_goes_through_each_serving(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(session.IDENTITY_ARMS_ENV, "reset-kernel")
    monkeypatch.setenv(session.MODES_ENV, "FULL_AND_PIECEWISE")
    monkeypatch.setenv(session.SERVING_ENV, "plain,mtp7")
    calls: list[tuple[str, str, dict]] = []
    records = identity.run(session.Settings({}, ("0",), tmp_path), spawn=quick_spawn(calls))[
        "records"
    ]
    full = GraphMode.FULL_AND_PIECEWISE
    mtp7 = arms.SERVING_BY_NAME["mtp7"]
    assert identity.key("stock", Runner.V1, full) == "stock/v1/FULL_AND_PIECEWISE"
    assert identity.key("stock", Runner.V1, full, mtp7) == "stock/v1/FULL_AND_PIECEWISE/mtp7"
    assert sorted(records) == sorted(
        identity.key(arm, runner, full, serving)
        for arm in ("stock", "stock-again", "reset-kernel")
        for runner in Runner
        for serving in (arms.PLAIN, mtp7)
    )
    starts = [(name, args["serving"]) for name, op, args in calls if op == "start"]
    # Each worker: plain first, then mtp7; stock V1 leads each serving.
    assert [serving for name, serving in starts if name == "reset-kernel/v2"] == ["plain", "mtp7"]
    first_mtp = starts.index(("stock/v1", "mtp7"))
    assert all(serving == "plain" for _, serving in starts[:first_mtp])


def test_the_prefix_workload_shares_two_blocks_and_a_half(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "zero_states", lambda net: 40)
    monkeypatch.setattr(worker, "layer_sums", lambda net: ["0" * 32])
    monkeypatch.setattr(worker, "slot_sums", lambda net: ["0" * 16])
    monkeypatch.setattr(worker, "rng_offset", lambda net: 0)
    monkeypatch.setattr(worker, "state_sha256", lambda net: "0" * 64)
    monkeypatch.setattr(worker.Engine, "_params", lambda self, max_tokens, logprobs: None)
    got = {}
    for serving in (arms.PLAIN, arms.SERVING_BY_NAME["prefix"]):
        fake = _RankedEngine(tp=1)
        engine = worker.Engine(STOCK, "/m")
        engine.llm = type("LLM", (), {"llm_engine": fake})()
        engine.serving = serving
        got[serving.name] = (engine.identity(), fake.prompts)
    plain, plain_prompts = got["plain"]
    prefix, prefix_prompts = got["prefix"]
    assert not any(plain["cached_tokens"].values()) and plain["block_size"] == 64
    assert plain["counters"] == {}
    shared = [f"r{i}" for i in worker.SHARED_PREFIX_REQUESTS]
    for rid, ids in prefix_prompts.items():
        if rid in shared:
            assert ids[:160] == prefix_prompts["r0"][:160] and ids[160:] == plain_prompts[rid]
        else:
            assert ids == plain_prompts[rid]
    assert {rid for rid, n in prefix["cached_tokens"].items() if n} == set(shared[1:])


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


def test_report_names_each_serving_and_its_evidence() -> None:
    stock = {
        **_record(["a" * 64, "b" * 64], [1, 2]),
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
                    "stock/v1/eager": _record(["a" * 64], [1]),
                    "stock/v1/FULL_AND_PIECEWISE/seed-serving": stock,
                    "reset-kernel/v1/FULL_AND_PIECEWISE/seed-serving": stock,
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


# The timing's floor-rng arm, MTP verify iterations and mixed steps.


def test_floor_rng_draws_one_element_per_forward() -> None:
    fake = worker._OneDraw(torch, every=4)
    before = torch.default_generator.get_state()
    seeds = [fake.randint(0, 2**32, (1,), device="cpu") for _ in range(8)]
    after = torch.default_generator.get_state()
    assert all(seed is seeds[0] for seed in seeds) and seeds[0].tolist() == [0x5EED]
    # Two forwards of four calls: two one-element draws, at calls 0 and 4.
    torch.default_generator.set_state(before)
    draw = torch.empty(1, dtype=torch.int64)
    for _ in range(2):
        draw.random_(0, 2**32)
    assert fake._draws["cpu"].tolist() == draw.tolist()
    assert torch.equal(torch.default_generator.get_state(), after)
    assert BY_NAME["floor-rng"] in TIMING_ARMS and BY_NAME["floor-rng"] not in IDENTITY_ARMS
    assert BY_NAME["floor-rng"].microbench == "floor-rng"


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


@pytest.mark.parametrize(
    ("serving", "mode", "sizes"),
    [
        ("plain", GraphMode.FULL_AND_PIECEWISE, [1, 2, 4, 8, 128]),
        ("mtp7", GraphMode.FULL_AND_PIECEWISE, [8, 16, 32, 64, 128]),
        ("plain", GraphMode.EAGER, None),
    ],
)
def test_a_step_budget_is_also_a_captured_size(serving: str, mode: GraphMode, sizes) -> None:
    """A mixed step that fills the budget runs piecewise graphs of that size."""
    serving_ = arms.SERVING_BY_NAME[serving]
    kwargs = arms.engine_kwargs("/m", mode, serving=serving_, step_tokens=128)
    assert kwargs["max_num_batched_tokens"] == 128
    assert kwargs.get("cudagraph_capture_sizes") == sizes
    plain = arms.engine_kwargs("/m", mode, serving=serving_)
    assert {k: v for k, v in kwargs.items() if k not in plain or plain[k] != v} == {
        "max_num_batched_tokens": 128,
        **({"cudagraph_capture_sizes": sizes} if sizes else {}),
    }


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
    assert {op for _, op, _ in calls if op != "start"} == {workload}
    saved = json.loads((tmp_path / f"timing{plan.tag}.json").read_text())
    assert (
        (saved["serving"], saved["workload"]) == (serving, workload) == (data["serving"], workload)
    )
    partial = tmp_path / f"timing-v1{plan.tag}-partial.json"
    # A run cut off by its time limit is reported from the partial files, as its steps.
    reported = report.from_partials([f"v1={partial}"])
    assert (reported["serving"], reported["workload"]) == (serving, workload)
    assert report.steps_heading(reported) == report.steps_heading(saved)


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


class _Gpu:
    """One CUDA stream beside the host's clock, simulated: a kernel starts once
    the host has enqueued it and the stream is free; an event completes when
    the stream reaches it; the host blocks while `depth` launches wait."""

    CLOCK_HZ = 1.98e9  # the H200's top SM clock, below SPIN_CYCLES_PER_S

    def __init__(self, monkeypatch: pytest.MonkeyPatch, depth: int = 1000) -> None:
        self.host = 0.0  # the host's clock, in seconds
        self.free = 0.0  # when the stream has run all that is enqueued
        self.depth = depth
        self.starts: list[float] = []  # the start on the stream of each launch not started
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at = math.inf

            def record(self) -> None:
                self.at = gpu.free = max(gpu.free, gpu.host)

            def query(self) -> bool:
                return gpu.host >= self.at

            def elapsed_time(self, end: Event) -> float:
                assert gpu.host >= end.at, "synchronize first"
                return (end.at - self.at) * 1e3

        class Graph:
            """A piecewise graph: one launch of a piece's kernels."""

            def replay(self) -> None:
                gpu.kernel(gpu.piece_s)

        self.piece_s = 0.0
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(
            torch.cuda, "_sleep", lambda cycles: self.kernel(cycles / self.CLOCK_HZ)
        )
        monkeypatch.setattr(torch.cuda, "synchronize", self.synchronize)
        monkeypatch.setattr(worker.time, "perf_counter", lambda: self.host)

    def kernel(self, seconds: float, host_s: float = 0.0) -> None:
        """Enqueues a kernel of `seconds` after `host_s` of the host's time."""
        self.host += host_s
        self.starts = [start for start in self.starts if start > self.host]  # still waiting
        if len(self.starts) >= self.depth:  # a full queue: until one launch starts
            self.host = self.starts[len(self.starts) - self.depth]
        start = max(self.free, self.host)
        self.starts.append(start)
        self.free = start + seconds

    def synchronize(self) -> None:
        self.host = max(self.host, self.free)

    def forward(self, layers: int, host_s: float, gpu_s: float, sync_at: int = -1) -> None:
        """A PIECEWISE forward's kernels: per layer a replayed piece, then 9
        eager kernels, `host_s` and `gpu_s` in all; a sync after layer `sync_at`."""
        self.piece_s = gpu_s / layers / 10
        for layer in range(layers):
            self.host += host_s / layers / 10
            torch.cuda.CUDAGraph().replay()
            for _ in range(9):
                self.kernel(gpu_s / layers / 10, host_s=host_s / layers / 10)
            if layer == sync_at:
                self.synchronize()  # e.g. a .item() inside the forward


def _runner_module(monkeypatch: pytest.MonkeyPatch) -> tuple[object, list[object]]:
    """A model runner's module: its set_forward_context, and every call's
    attn_metadata (in `opened`), as the runner's module holds vLLM's."""
    import contextlib
    import types

    module = types.ModuleType("fake_vllm_model_runner")
    opened: list[object] = []

    @contextlib.contextmanager
    def set_forward_context(attn_metadata, vllm_config, **kwargs):
        opened.append(attn_metadata)
        yield

    module.set_forward_context = set_forward_context
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module, opened


def _mamba_metadata(decodes: int, prefills: int, prefill_tokens: int) -> dict:
    """attn_metadata as the runners pass it: an attention layer's, then a Mamba layer's."""
    from types import SimpleNamespace as NS

    return {
        "layers.7.mixer": NS(num_actual_tokens=decodes + prefill_tokens),
        "layers.0.mixer": NS(
            num_decodes=decodes,
            num_prefills=prefills,
            num_prefill_tokens=prefill_tokens,
            num_decode_tokens=decodes,
        ),
    }


def test_a_forward_s_gpu_time_is_its_kernels_behind_spins(monkeypatch) -> None:
    """Each segment's spin outlasts the host's enqueuing of it, so the spans
    sum to the kernels' GPU time, not the host's; a forward a spin did not
    cover (a sync inside) is left out; a forward that raises leaves nothing."""
    gpu = _Gpu(monkeypatch)
    module, opened = _runner_module(monkeypatch)
    spans = worker.ForwardGpuSpans()
    spans.install(module)
    piecewise = GraphMode.PIECEWISE

    def forward(host_s: float, gpu_s: float, sync_at: int = -1) -> None:
        metadata = _mamba_metadata(2, 1, 126)
        with module.set_forward_context(metadata, None, cudagraph_runtime_mode=piecewise):
            gpu.forward(40, host_s, gpu_s, sync_at)

    forward(host_s=10e-3, gpu_s=3e-3)  # not watched: passed through
    assert spans.take() == {"batches": [], "host_s": [], "segments_s": [], "uncovered": 0}
    assert len(opened) == 1 and spans.spin_cycles(0) == worker.FORWARD_SPIN_FIRST_S * 2e9

    spans.watching = True
    forward(host_s=10e-3, gpu_s=3e-3)  # watched, not spun: its batch and host time
    gpu.synchronize()
    assert spans.take() == {
        "batches": [["PIECEWISE", 2, 1, 126]],
        "host_s": [pytest.approx(10e-3)],
        "segments_s": [None],
        "uncovered": 0,
    }
    # 40 replays: 5 segments of 8, each about a fifth of the host's time.
    measured = spans.segment_host_s
    assert measured == [pytest.approx(2e-3, rel=0.02)] * 5
    assert spans.spin_cycles(1) == pytest.approx(2 * 2e-3 * 2e9)
    assert spans.spin_cycles(7) == spans.spin_cycles(0)  # beyond the last: the longest
    spans.segment_host_s = [1e-6]
    assert spans.spin_cycles(0) == worker.FORWARD_SPIN_MIN_S * 2e9
    spans.segment_host_s = [2.0]
    assert spans.spin_cycles(0) == worker.FORWARD_SPIN_MAX_S * 2e9
    spans.segment_host_s = measured

    spans.spinning = True
    forward(host_s=10e-3, gpu_s=3e-3)
    forward(host_s=10e-3, gpu_s=3e-3)
    forward(host_s=12e-3, gpu_s=4e-3)  # a fifth more host time than the forward before
    forward(host_s=10e-3, gpu_s=3e-3, sync_at=20)
    with (
        pytest.raises(ValueError, match="inside the forward"),
        module.set_forward_context({}, None, cudagraph_runtime_mode=piecewise),
    ):
        raise ValueError("inside the forward")
    gpu.synchronize()
    taken = spans.take()
    assert [sum(s) if s else None for s in taken["segments_s"]] == [
        pytest.approx(3e-3),
        pytest.approx(3e-3),
        pytest.approx(4e-3),
        None,
    ]
    assert [len(s) for s in taken["segments_s"][:3]] == [5, 5, 5]
    assert taken["uncovered"] == 1 and len(taken["batches"]) == 4 and len(opened) == 7


def test_segments_keep_the_launch_queue_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """400 launches a forward on a stream that holds 100: a spin covers a
    segment of 8 replays (80 launches), not the whole forward (the control)."""
    gpu = _Gpu(monkeypatch, depth=100)
    module, _ = _runner_module(monkeypatch)
    spans = worker.ForwardGpuSpans()
    spans.install(module)
    spans.watching = spans.spinning = True

    def forwards(n: int) -> list:
        for _ in range(n):
            with module.set_forward_context({}, None, cudagraph_runtime_mode=None):
                gpu.forward(40, host_s=10e-3, gpu_s=3e-3)
        gpu.synchronize()
        return [sum(s) if s else None for s in spans.take()["segments_s"]]

    assert forwards(3)[1:] == [pytest.approx(3e-3)] * 2
    monkeypatch.setattr(worker, "FORWARD_SEGMENT_REPLAYS", 1000)  # one segment a forward
    assert forwards(3)[1:] == [None, None]


def test_a_forward_s_batch_is_read_off_its_mamba_metadata() -> None:
    assert worker.mamba_batch(_mamba_metadata(4, 2, 124)) == [4, 2, 124]
    assert worker.mamba_batch([_mamba_metadata(4, 2, 124)]) == [None, None, None]
    assert worker.mamba_batch(None) == [None, None, None]


def test_merged_gpu_spans_take_the_fastest_rank_of_each_segment() -> None:
    ranks = [
        {"segments_s": [[1.0, 2.0], None, [3.0, 1.0]], "host_s": [5.0, 9.0, 4.0]},
        {"segments_s": [[2.0, 1.0], [2.0, 2.0], [2.5, 1.5]], "host_s": [6.0, 1.0, 4.0]},
    ]
    assert worker.merge_forward_gpu(ranks) == {
        "forward_gpu_s": 2.75,  # median of 1 + 1, 2.5 + 1: forward 1 was uncovered on rank 0
        "gpu_forwards": 2,
        "gpu_uncovered": 1,
        "spun_host_s": 6.0,  # median of 6, 9, 4
    }
    uncovered = [{"segments_s": [None], "host_s": [1.0]}]
    assert worker.merge_forward_gpu(uncovered)["forward_gpu_s"] is None
    with pytest.raises(worker.RankError, match=r"different numbers of forwards: \[3, 1\]"):
        worker.merge_forward_gpu([ranks[0], {"segments_s": [[1.0]], "host_s": [1.0]}])
    with pytest.raises(worker.RankError, match="a forward in different segments"):
        worker.merge_forward_gpu(
            [
                {"segments_s": [[1.0]], "host_s": [1.0]},
                {"segments_s": [[1.0, 1.0]], "host_s": [1.0]},
            ]
        )


@pytest.mark.parametrize(
    ("batches", "error"),
    [
        ([["PIECEWISE", 2, 1, 126], ["PIECEWISE", 2, 2, 126]], None),
        ([], "no forward was watched"),
        ([["PIECEWISE", 2, 1, 126], ["NONE", 2, 1, 254]], "forward 1 ran 2 decodes and 1 "),
        ([["PIECEWISE", 3, 1, 125]], "ran 3 decodes"),
        ([["PIECEWISE", 2, 0, 0]], "and 0 prefills"),
        ([["FULL", 2, 0, 0]], "in CUDA-graph mode FULL: not a mixed step of 2 decodes"),
    ],
)
def test_a_mixed_step_is_decodes_beside_a_prefill_on_piecewise_graphs(batches, error) -> None:
    got = worker.mixed_batch_error(batches, bs=2)
    assert got is None if error is None else error in got


def test_untimed_replays_are_counted_with_no_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    class Graph:
        def replay(self) -> None:
            calls.append("replay")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append("spin"))
    replays = worker.ReplaySpans()
    replays.install()
    replays.timing = False
    Graph().replay()
    Graph().replay()
    assert calls == ["replay", "replay"] and replays.pairs == [] and replays.untimed == 2
    spans = worker.RankSpans(replays)
    assert spans.take()["replays"] == 2 and replays.untimed == 0


class _MixedEngine:
    """An LLMEngine of one rank whose every step runs one forward through the
    runner (its module's set_forward_context): the decodes, then the long
    prompts' chunks in the rest of `budget`; each forward takes HOST_S of the
    host's time to enqueue GPU_S of kernels, 40 piecewise replays among them."""

    HOST_S, GPU_S = 10e-3, 3e-3

    def __init__(self, monkeypatch, budget: int, max_model_len: int, mode=GraphMode.PIECEWISE):
        from types import SimpleNamespace as NS

        self.gpu = _Gpu(monkeypatch)
        module, self.opened = _runner_module(monkeypatch)
        gpu, cost = self.gpu, (self.HOST_S, self.GPU_S)

        class Runner:
            def execute_model(self, attn_metadata: dict) -> None:
                with module.set_forward_context(attn_metadata, None, cudagraph_runtime_mode=mode):
                    gpu.forward(40, *cost)

        Runner.__module__ = module.__name__
        self.vllm_config = NS(
            scheduler_config=NS(max_num_batched_tokens=budget),
            model_config=NS(max_model_len=max_model_len),
        )
        self.budget = budget
        self.left: dict[str, int] = {}
        self.aborted: list[str] = []
        self.worker = NS(rank=0, model_runner=Runner())
        for name in ("_REPLAYS", "_SPANS", "_FORWARDS"):
            monkeypatch.setattr(worker, name, None)

    def collective_rpc(self, method, args=()):
        return [method(self.worker, *args)]

    def add_request(self, rid: str, prompt: dict, params: object) -> None:
        self.left[rid] = len(prompt["prompt_token_ids"]) if rid.startswith("p") else 10**6

    def abort_request(self, ids: list[str]) -> None:
        self.aborted += ids
        for rid in ids:
            self.left.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return False

    def step(self) -> list:
        from types import SimpleNamespace as NS

        decodes = sum(not rid.startswith("p") for rid in self.left)
        budget, prefills, outs = self.budget - decodes, 0, []
        for rid in [r for r in self.left if r.startswith("p")]:
            take = min(budget, self.left[rid])
            if not take:
                break
            self.left[rid] -= take
            budget -= take
            prefills += 1
            if not self.left[rid]:
                del self.left[rid]
                outs.append(NS(request_id=rid, finished=True))
        chunk = self.budget - decodes - budget
        self.worker.model_runner.execute_model(_mamba_metadata(decodes, prefills, chunk))
        return outs


def _mixed_engine(fake: _MixedEngine, monkeypatch: pytest.MonkeyPatch) -> worker.Engine:
    monkeypatch.setattr(worker.Engine, "_params", lambda self, max_tokens, logprobs: None)
    engine = worker.Engine(STOCK, "/m")
    engine.llm = type("LLM", (), {"llm_engine": fake})()
    return engine


def test_mixed_steps_keep_a_prefill_in_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _MixedEngine(monkeypatch, budget=128, max_model_len=1024)
    got = _mixed_engine(fake, monkeypatch).mixed(bs=2, steps=12, warm=0)
    # Two bursts' budget of 1016-token prompts, and one more: the last is
    # still prefilling after the timed steps, and is aborted with the others.
    assert got["prefills"] == math.ceil(26 * 128 / 1016) + 1 == 5
    assert got["prefills_done"] < got["prefills"]
    assert sum(rid.startswith("p") for rid in fake.aborted) == got["prefills"]
    assert got["prefill_tokens"] == 126 and len(fake.opened) == 24
    # The first burst's figures are host-bound; the second's are the kernels'.
    assert got["step_s"] == pytest.approx(fake.HOST_S, rel=0.01)  # and the last kernel's tail
    assert got["forward_s"] == pytest.approx(fake.HOST_S)
    assert got["forward_gpu_s"] == pytest.approx(fake.GPU_S)
    assert (got["gpu_forwards"], got["gpu_uncovered"]) == (12, 0)
    assert got["spun_host_s"] == pytest.approx(fake.HOST_S)
    assert got["replays_per_step"] == 40 and got["replay_s"] is None  # counted, not timed
    # The replays are timed again after (the decode workload's timers).
    assert worker._REPLAYS.timing and not worker._FORWARDS.watching
    # A step budget larger than mixed() planned for: every prefill ends early.
    fake.budget = 10**6
    with pytest.raises(RuntimeError, match="prefills finished within 24 steps: not mixed"):
        _mixed_engine(fake, monkeypatch).mixed(bs=2, steps=12, warm=0)


def test_mixed_steps_must_run_on_piecewise_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step larger than every captured size runs without graphs (mode NONE)."""
    from types import SimpleNamespace as NS

    fake = _MixedEngine(monkeypatch, budget=128, max_model_len=1024, mode=NS(name="NONE"))
    with pytest.raises(
        RuntimeError, match="forward 0 ran 2 decodes and 1 prefills in CUDA-graph mode NONE"
    ):
        _mixed_engine(fake, monkeypatch).mixed(bs=2, steps=12, warm=0)
    assert not worker._FORWARDS.watching and worker._REPLAYS.timing


def test_a_profile_of_mixed_steps_checks_they_were_mixed(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _MixedEngine(monkeypatch, budget=128, max_model_len=1024)
    monkeypatch.setattr(worker, "_start_profile", lambda _worker: None)
    monkeypatch.setattr(worker, "_stop_profile", lambda _worker, steps: [["k", 1.0, 2.0]])
    engine = _mixed_engine(fake, monkeypatch)
    got = engine.profile(bs=2, steps=12, warm=0, workload="mixed")
    assert got == {"steps": 12, "kernels": [["k", 1.0, 2.0]]} and len(fake.opened) == 12
    assert worker._REPLAYS.timing and not worker._FORWARDS.watching
    with pytest.raises(ValueError, match="profile takes the workload decode or mixed"):
        engine.profile(bs=2, steps=12, warm=0, workload="prefill")
    fake.budget = 2  # the decodes fill it: no prefill chunk fits beside them
    with pytest.raises(RuntimeError, match="forward 0 ran 2 decodes and 0 prefills"):
        engine.profile(bs=2, steps=12, warm=0, workload="mixed")
    text = report.profile_markdown(
        {"workload": "mixed", "runners": {"v1": {"profile": {"stock": {"2": got}}}}}
    )
    assert "**v1, BS 2: GPU kernels per mixed step**" in text


def test_the_profile_takes_batch_sizes_the_workload_times(monkeypatch) -> None:
    monkeypatch.setenv(timing.WORKLOAD_ENV, "mixed")
    monkeypatch.setenv(session.PROFILE_ENV, "1,8")
    with pytest.raises(ValueError, match=r"mixed timing measures \(1, 2, 4\); got \(1, 8\)"):
        timing.Plan.from_env()
    monkeypatch.setenv(session.PROFILE_ENV, "1,4")
    assert timing.Plan.from_env().profile_batch_sizes == (1, 4)


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


def test_the_identity_run_can_judge_one_runner(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With SR_ENGINE_RUNNERS=v2 the V2 engines run without waiting for a V1
    stock engine that never starts; only V2 cells are recorded."""
    monkeypatch.setenv(session.IDENTITY_ARMS_ENV, "reset-kernel")
    monkeypatch.setenv(session.MODES_ENV, "eager")
    calls: list[tuple[str, str, dict]] = []
    settings = session.Settings({}, ("0",), tmp_path, (Runner.V2,))
    records = identity.run(settings, spawn=quick_spawn(calls))["records"]
    assert sorted(records) == sorted(
        identity.key(arm, Runner.V2, GraphMode.EAGER)
        for arm in ("stock", "stock-again", "reset-kernel")
    )
    assert {name.split("/")[1] for name, _, _ in calls} == {"v2"}


class _Instance:
    """One engine process of an arm: every figure carries its offset, of n µs
    for the arm's n-th process spawned; it logs its calls and its close."""

    def __init__(self, name: str, n: int, log: list[tuple], fail_start: bool = False) -> None:
        self.name, self.n, self.log, self.fail_start = name, n, log, fail_start
        self.closed = False

    def call(self, op: str, **args: object) -> dict:
        assert not self.closed, f"{self.name} #{self.n} called after its close"
        self.log.append(("call", self.name, self.n, op))
        if op == "start" and self.fail_start:
            raise WorkerError(f"{self.name}: no kernel")
        if op == "start":
            return {"start_s": 1.0}
        offset = self.n * 1e-6
        return {"forward_gpu_s": 5e-3 + offset, "replay_s": 1e-3 + offset, "instance": self.n}

    def engagement(self) -> list[str]:
        return []

    def close(self) -> None:
        self.log.append(("close", self.name, self.n))
        self.closed = True


def instance_spawn(log: list[tuple], fail_spawn=(), fail_start=()):
    """timing.run's spawn: a new _Instance per (arm, runner) per call; the
    (name, n) pairs of `fail_spawn` do not spawn, those of `fail_start` do not start."""
    spawned: dict[str, int] = {}

    def spawn(pairs, settings, tag, extra_env):
        log.append(("spawn", tag, [f"{a.name}/{r.value}" for a, r in pairs]))
        workers: dict = {}
        for a, r in pairs:
            name = f"{a.name}/{r.value}"
            n = spawned[name] = spawned.get(name, -1) + 1
            workers[a.name, r.value] = (
                WorkerError(f"{name}: the worker died")
                if (name, n) in fail_spawn
                else _Instance(name, n, log, (name, n) in fail_start)
            )
        return workers

    return spawn


def _timing_settings(tmp_path: Path, runners=tuple(Runner), names=("stock", "floor")):
    arms_ = tuple(BY_NAME[name] for name in names)
    return session.Settings({}, ("0",), tmp_path, runners, arms_)


@pytest.mark.parametrize(
    ("rounds", "every", "engines"),
    [(4, 2, [0, 0, 1, 1]), (5, 2, [0, 0, 1, 1, 2]), (3, 1, [0, 1, 2]), (3, None, [0, 0, 0])],
)
def test_the_timing_starts_a_runners_engines_again_every_k_rounds(
    tmp_path: Path, rounds: int, every: int | None, engines: list[int]
) -> None:
    log: list[tuple] = []
    plan = timing.Plan(rounds=rounds, batch_sizes=(1, 2), rounds_per_engine=every)
    data, workers = timing.run(_timing_settings(tmp_path), plan, spawn=instance_spawn(log))
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
    # Every engine is closed before its successor spawns (and an _Instance
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
    settings = _timing_settings(tmp_path, names=("stock", "floor", "floor-rng"))
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


@pytest.mark.parametrize(("workload", "figure"), [("mixed", "forward-gpu"), ("decode", "replay")])
def test_the_spread_between_engines_shows_only_with_several_and_holds_their_offset(
    tmp_path: Path, workload: str, figure: str
) -> None:
    """The control: each engine process's offset (n µs for the n-th) is in
    every sample of it, so one engine per arm has no spread to show."""
    plan = timing.Plan(rounds=3, batch_sizes=(1,), workload=workload)
    settings = _timing_settings(tmp_path / "one", runners=(Runner.V1,))
    one, _ = timing.run(settings, plan, instance_spawn([]))
    assert "engines" not in one["runners"]["v1"] and report.engine_markdown(one) == ""
    plan = dataclasses.replace(plan, rounds_per_engine=1)
    settings = _timing_settings(tmp_path, runners=(Runner.V1,))
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


def test_a_runners_rounds_in_several_runs_are_put_together(tmp_path: Path) -> None:
    """Two device calls of one runner: 3 + 2 rounds, a new engine every round,
    are 5 engines per arm, paired round by round, summarized as one run."""
    settings = _timing_settings(tmp_path / "a", runners=(Runner.V1,))
    first, _ = timing.run(
        settings, timing.Plan(rounds=3, batch_sizes=(1,), rounds_per_engine=1), instance_spawn([])
    )
    settings = _timing_settings(tmp_path / "b", runners=(Runner.V1,))
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
