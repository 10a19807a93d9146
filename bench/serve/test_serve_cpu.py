"""The serve harness on CPU: fake servers (cpu_fakes.py, real processes and HTTP) and a
fake vllm bench serve; the plan, the resident servers and their rotated blocks, the
resume after a cut, the KV fallback, the budget, the identity verdicts and the
report."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.engine.arms import Runner

from . import (
    bench_client,
    cpu_fakes,
    gpu_clocks,
    host_load,
    identity,
    judge,
    model_dir,
    records,
    report,
    run,
    server,
    settings,
)
from .settings import Settings, Shape

REPO = Path(__file__).resolve().parents[2]
SHAPES = settings.shapes((1, 8), 4, 64, 16, True)
COMMITTED = REPO / "bench/results/serve-nvidia-h200-20261203.serve.json"
ABC = ["stock", "reset", "forward-context"]
CBA = ABC[::-1]


@pytest.fixture(autouse=True)
def _quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "POLL_S", 0.05)


def _settings(**changes: object) -> Settings:
    base = dict(shapes=SHAPES, pairs=2, blocks=2, start_timeout=30.0, warmups=0)
    return Settings(**{**base, **changes})


def _run(
    tmp_path: Path,
    client: Callable[[list[str]], dict],
    extra_env: dict[str, str] | None = None,
    arm_env: dict[str, dict[str, str]] | None = None,
    **changes: object,
) -> run.Run:
    def argv_for(arm, runner, port, kv):
        return [sys.executable, "-m", "bench.serve.cpu_fakes", "--port", str(port), "--kv", kv]

    def env_for(arm, runner):
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "SR_ENGINE_ARM": arm.name,
            **arm.env,
            **runner.env,
        }
        env.update(extra_env or {})
        env.update((arm_env or {}).get(arm.name, {}))
        return env

    return run.Run(
        _settings(**changes),
        {"stock": "/nowhere"},
        tmp_path / "out",
        tmp_path / "resume" / "serve.json",
        client,
        argv_for,
        env_for,
        folder=tmp_path / "model",
    )


class Watch:
    """vllm bench serve's stand-in over the fake client: notes, per call, the arm whose
    server the call went to, the arms with a server up, and whether every one of those
    servers runs and answers /health."""

    def __init__(self, fake: cpu_fakes.FakeClient) -> None:
        self.fake, self.seen = fake, []
        self.run: run.Run | None = None

    def __call__(self, argv: list[str]) -> dict:
        port = int(argv[argv.index("--port") + 1])
        resident = self.run.resident
        arm = next(name for name, r in resident.items() if r.server.port == port)
        alive = all(
            r.server.process.poll() is None and r.server.get("/health") == ""
            for r in resident.values()
        )
        self.seen.append((arm, tuple(resident), alive))
        return self.fake(argv)

    def arms(self) -> list[str]:
        return [arm for arm, _, _ in self.seen]


def _watched(
    tmp_path: Path, fake: cpu_fakes.FakeClient, **changes: object
) -> tuple[run.Run, Watch]:
    watch = Watch(fake)
    watch.run = _run(tmp_path, watch, **changes)
    return watch.run, watch


def test_plan_gives_the_rounds_and_their_control_and_blocks_rotate() -> None:
    steps = [
        (r.runner.value, r.pair, [s.name for s in r.shapes], r.control)
        for r in run.plan(_settings(long_pairs=(1,)))
    ]
    assert steps == [("v1", 1, ["c1", "c8", "long"], True), ("v1", 2, ["c1", "c8"], False)]
    assert [run.rotation("ABC", b) for b in range(4)] == [list("ABC"), list("CBA")] * 2


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SR_SERVE_ARMS", "reset,stock")
    monkeypatch.setenv("SR_SERVE_CONCURRENCY", "1,2,4,8")
    monkeypatch.setenv("SR_SERVE_RUNNERS", "v1,v2")
    monkeypatch.setenv("SR_SERVE_LONG", "0")
    got = settings.from_env()
    assert [a.name for a in got.arms] == ["stock", "reset"]
    assert [(s.name, s.num_prompts) for s in got.shapes] == [
        ("c1", 16),
        ("c2", 16),
        ("c4", 16),
        ("c8", 16),
    ]
    assert got.runners == (Runner.V1, Runner.V2)
    assert got.blocks == 4
    monkeypatch.setenv("SR_SERVE_BLOCKS", "3")
    assert settings.from_env().blocks == 3
    for bad in ("0", "two", "2,3"):
        monkeypatch.setenv("SR_SERVE_BLOCKS", bad)
        with pytest.raises(settings.SettingsError, match="SR_SERVE_BLOCKS"):
            settings.from_env()
    monkeypatch.setenv("SR_SERVE_BLOCKS", "4")
    monkeypatch.setenv("SR_SERVE_ARMS", "reset")
    with pytest.raises(settings.SettingsError, match="must hold stock"):
        settings.from_env()


def test_a_full_run_records_every_part_and_judges_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fake block is shorter than a /proc/stat tick: the load of any two reads.
    monkeypatch.setattr(host_load, "summarize", lambda before, after: {"busy_pct": 12.5})
    client = cpu_fakes.FakeClient()
    data = _run(tmp_path, client).all()
    assert sorted(data["cells"]) == sorted(
        [f"v1/p{p}/{a}" for p in (1, 2) for a in ("stock", "reset", "forward-context")]
        + ["v1/p1/control-one-seed"]
    )
    assert len(client.calls) == 2 * 3 * 2 * 3  # rounds x shapes x blocks x arms; control: none
    stock = data["cells"]["v1/p1/stock"]
    assert set(stock["bench"]) == {"c1", "c8", "long"}
    blocks = stock["bench"]["c8"]["blocks"]
    assert [(b["block"], b["slot"], b["start"]) for b in blocks] == [(0, 0, 0), (1, 2, 0)]
    assert blocks[0]["median_tok_s_user"] == pytest.approx(15 / (3 * 0.01))
    assert "generated_texts" not in blocks[0]
    if host_load.PROC_STAT.exists():
        assert blocks[0]["host"] == {"busy_pct": 12.5}
    assert all(len(c["starts"]) == 1 for c in data["cells"].values())
    verdicts = judge.verdicts(data)
    assert verdicts and all(ok for _, ok, _ in verdicts), judge.failed(data)
    names = {name for name, _, _ in verdicts}
    assert "control differs [control-one-seed-v1-p1]" in names
    assert "stock is reproducible [v1-p1-p2]" in names
    assert "engagement line [reset-v1-p2]" in names
    saved = json.loads((tmp_path / "out" / "serve.json").read_text())
    assert saved == json.loads((tmp_path / "resume" / "serve.json").read_text())
    assert not list((tmp_path / "resume" / "serve-pids").glob("*.pid"))


def test_blocks_interleave_the_resident_servers_abc_cba(tmp_path: Path) -> None:
    fake = cpu_fakes.FakeClient()
    _, watch = _watched(tmp_path, fake, pairs=1, blocks=4)
    data = watch.run.all()
    assert watch.arms() == (ABC + CBA) * 2 * 3  # 4 blocks of each of 3 shapes
    assert all(up == tuple(ABC) and alive for _, up, alive in watch.seen)
    ports = {c[c.index("--port") + 1] for c in fake.calls}
    assert len(ports) == 3  # one resident server per arm, every block of the round on it
    reset = data["cells"]["v1/p1/reset"]["bench"]["long"]["blocks"]
    assert [(b["block"], b["slot"]) for b in reset] == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert watch.run.resident == {}
    assert not list((tmp_path / "resume" / "serve-pids").glob("*.pid"))


def test_a_cut_run_resumes_with_the_missing_blocks_on_new_servers(tmp_path: Path) -> None:
    first, _ = _watched(tmp_path, cpu_fakes.FakeClient(stop_after=4))
    with pytest.raises(run.Stopped):
        first.all()
    assert not list((tmp_path / "resume" / "serve-pids").glob("*.pid"))  # all stopped
    cut = records.load(tmp_path / "resume" / "serve.json")
    done = {
        arm: [b["block"] for b in cut["cells"][f"v1/p1/{arm}"]["bench"]["c1"]["blocks"]]
        for arm in ABC
    }
    assert done == {"stock": [0], "reset": [0], "forward-context": [0, 1]}
    assert records.missing(cut["cells"]["v1/p1/stock"], SHAPES, True, 2) == (
        False,
        {"c1": [1], "c8": [0, 1], "long": [0, 1]},
    )
    second, watch = _watched(tmp_path, cpu_fakes.FakeClient())
    data = second.all()
    assert len(watch.seen) == 36 - 4
    assert watch.arms()[:5] == ["reset", "stock", *ABC]  # c1's block 1, then c8's block 0
    stock = data["cells"]["v1/p1/stock"]
    assert len(stock["starts"]) == 2 and len(data["cells"]["v1/p2/stock"]["starts"]) == 1
    assert [b["start"] for b in stock["bench"]["c1"]["blocks"]] == [0, 1]
    assert [b["start"] for b in stock["bench"]["c8"]["blocks"]] == [1, 1]
    forward = data["cells"]["v1/p1/forward-context"]["bench"]["c1"]["blocks"]
    assert [b["start"] for b in forward] == [0, 0]
    assert all(ok for _, ok, _ in judge.verdicts(data))
    measured = [c for k, c in data["cells"].items() if not k.endswith("control-one-seed")]
    assert all(records.missing(c, SHAPES, True, 2) == (False, {}) for c in measured)


def test_fp8_that_fails_to_start_falls_back_once(tmp_path: Path) -> None:
    data = _run(tmp_path, cpu_fakes.FakeClient(), {"FAKE_FAIL_KV": "fp8"}, pairs=1).all()
    assert data["meta"]["kv_cache_dtype"] == "auto"
    assert "not supported here" in data["meta"]["kv_cache_fallback"]
    assert all(c["kv_cache_dtype"] == "auto" for c in data["cells"].values())


def test_a_server_that_never_starts_is_an_error_of_its_cell(tmp_path: Path) -> None:
    data = _run(
        tmp_path, cpu_fakes.FakeClient(), {"FAKE_FAIL_KV": "auto"}, pairs=1, kv_cache_dtype="auto"
    ).all()
    assert all("start: the server exited" in c["errors"][0] for c in data["cells"].values())


def test_the_other_arms_blocks_run_beside_an_arm_whose_server_did_not_start(
    tmp_path: Path,
) -> None:
    watch = Watch(cpu_fakes.FakeClient())
    watch.run = _run(
        tmp_path,
        watch,
        arm_env={"reset": {"FAKE_FAIL_KV": "auto"}},
        pairs=1,
        kv_cache_dtype="auto",
    )
    data = watch.run.all()
    reset = data["cells"]["v1/p1/reset"]
    assert "start: the server exited" in reset["errors"][0]
    assert "bench" not in reset and "starts" not in reset
    both = ["stock", "forward-context"]
    assert watch.arms() == (both + both[::-1]) * 3
    assert all(up == tuple(both) and alive for _, up, alive in watch.seen)
    for arm in both:
        cell = data["cells"][f"v1/p1/{arm}"]
        assert "errors" not in cell and len(cell["bench"]["long"]["blocks"]) == 2
    text = report.markdown(data)
    assert "| ITL p50 (ms) | 10 | - | 10 (+0.0 %; +0.0..+0.0 %; 2) |" in text


def test_the_judge_catches_a_patched_arm_that_differs_and_a_control_that_does_not(
    tmp_path: Path,
) -> None:
    data = _run(tmp_path, cpu_fakes.FakeClient(), pairs=1).all()
    cells = data["cells"]
    cells["v1/p1/reset"]["identity"]["requests"][2]["logprobs"][5] = (0.5).hex()
    cells["v1/p1/control-one-seed"]["identity"] = cells["v1/p1/stock"]["identity"]
    cells["v1/p1/forward-context"]["engagement"] = []
    failed = {name: detail for name, _, detail in judge.failed(data)}
    assert failed.keys() == {
        "identical to stock [reset-v1-p1]",
        "control differs [control-one-seed-v1-p1]",
        "engagement line [forward-context-v1-p1]",
    }
    assert failed["identical to stock [reset-v1-p1]"].startswith("request 2, position 5: logprobs")


def _block(block: int, itl: float, start: int = 0) -> dict:
    return {"block": block, "start": start, "median_itl_ms": itl, "completed": 4}


def test_the_report_pairs_each_block_with_stocks_of_the_same_round_and_index() -> None:
    # Pooled over blocks and rounds, reset is 7.9 % slower than stock; paired with
    # stock's block of its round and index, its changes are +20, +5, 0 (round 1) and
    # +10 three times (round 2): median +10.
    itl = {
        (1, "stock"): [(2, 40.0), (0, 10.0), (1, 20.0)],  # stored out of block order
        (1, "reset"): [(0, 12.0), (1, 21.0), (2, 40.0)],
        (2, "stock"): [(0, 40.0), (1, 40.0), (2, 40.0)],
        (2, "reset"): [(0, 44.0), (1, 44.0), (2, 44.0, 1)],  # block 2 on a second start
    }
    data = records.empty()
    data["meta"]["settings"] = {"arms": ["stock", "reset"], "pairs": 2, "blocks": 3}
    for (pair, arm), blocks in itl.items():
        data["cells"][records.cell_key("v1", pair, arm)] = {
            "arm": arm,
            "pair": pair,
            "runner": "v1",
            "starts": [100.0, 50.0] if len(blocks[-1]) == 3 else [100.0],
            "bench": {"c1": {"blocks": [_block(*b) for b in blocks]}},
        }
    text = report.markdown(data)
    assert "| ITL p50 (ms) | 31.67 | 34.17 (+10.0 %; +0.0..+20.0 %; 6) |" in text
    assert "- p1 stock, start 0: b0 10.000, b1 20.000, b2 40.000" in text
    assert "- p2 reset, start 0: b0 44.000, b1 44.000" in text
    assert "- p2 reset, start 1: b2 44.000" in text
    assert "v1/p2/reset 100, 50; v1/p2/stock 100" in text
    assert "2 rounds of 3 blocks" in text
    assert report.paired({1: [_block(0, 11.0)]}, {1: [_block(1, 10.0)]}, "median_itl_ms") == []


def test_old_records_of_one_server_per_arm_still_report_and_judge(tmp_path: Path) -> None:
    data = json.loads(COMMITTED.read_text())
    assert not judge.failed(data)
    text = report.markdown(data)
    assert "| ITL p50 (ms) | 9.999 | 11.53 (-1.3 %; -1.3..-1.3 %; 1) |" in text
    assert "- p2 stock, start 0: b0 8.315" in text
    assert "v1/p1/stock 144;" in text
    stock = data["cells"]["v1/p1/stock"]
    assert records.missing(stock, SHAPES, True, 1) == (False, {})
    assert records.missing(stock, SHAPES, True, 2) == (
        False,
        {"c1": [1], "c8": [1], "long": [1]},
    )
    prefix = tmp_path / "serve-x"
    assert report.main([str(COMMITTED), "--prefix", str(prefix)]) == 0
    assert json.loads(Path(f"{prefix}.serve.json").read_text()) == data


def test_the_budget_stops_before_a_server_that_would_not_fit(tmp_path: Path) -> None:
    data = _run(tmp_path, cpu_fakes.FakeClient(), budget_s=1.0).all()
    assert data["cells"] == {}


def test_the_budget_stops_before_a_block_that_would_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run, "FIRST_START_GUESS_S", 1.0)
    fake = cpu_fakes.FakeClient()

    def slow_client(argv: list[str]) -> dict:
        runner.slowest_block = 1e6  # as if this block had taken that long
        return fake(argv)

    runner = _run(tmp_path, slow_client, budget_s=600.0)
    data = runner.all()
    assert len(fake.calls) == 1
    assert [b["block"] for b in data["cells"]["v1/p1/stock"]["bench"]["c1"]["blocks"]] == [0]
    assert all(len(data["cells"][f"v1/p1/{arm}"]["starts"]) == 1 for arm in ABC)
    assert not list((tmp_path / "resume" / "serve-pids").glob("*.pid"))
    assert records.load(tmp_path / "resume" / "serve.json")["cells"] == data["cells"]


def test_a_round_that_fits_only_warm_warms_each_server_up_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three cold starts and a block do not fit, one cold start does: the arms' servers
    start and stop, and the round then runs on the warm starts; a later call on the same
    machine (the same resume file) warms nothing up."""
    monkeypatch.setattr(run, "FIRST_START_GUESS_S", 150.0)  # 3 x 150 + 30 > 350
    fake = cpu_fakes.FakeClient()
    first = _run(tmp_path, fake, budget_s=350.0, pairs=1)  # 3 x 90 + 30 < 350
    data = first.all()
    assert list(data["meta"]["warm_starts"]) == [f"v1/{arm}" for arm in ABC]
    assert all(len(data["cells"][f"v1/p1/{arm}"]["starts"]) == 1 for arm in ABC)
    assert fake.calls, "the round ran after the warm-up"
    assert {f"v1/{arm}" for arm in ABC} <= set(data["meta"]["last_start_s"])
    later = _run(tmp_path, cpu_fakes.FakeClient(), budget_s=350.0, pairs=1)
    later.warm_up = None  # type: ignore[assignment]  # called, it would fail the run
    stock = first.settings.arms[0]
    assert later.start_guess(stock, Runner.V2) == 150.0, "never started on V2 here"
    assert later.start_guess(stock, Runner.V1) < 90.0, "its warm start in the round"
    del later.data["meta"]["last_start_s"]["v1/stock"]
    assert later.start_guess(stock, Runner.V1) == run.WARM_START_GUESS_S, "warmed up only"
    later.all()


def test_server_command_has_the_seed_documents_flags(tmp_path: Path) -> None:
    argv = server.command(_settings(), tmp_path, 8123, "fp8")
    text = " ".join(argv)
    for flag in (
        "--mamba-backend flashinfer",
        "--mamba-ssm-cache-dtype float16",
        "--enable-mamba-cache-stochastic-rounding",
        "--mamba-cache-philox-rounds 5",
        "--mamba-cache-mode align",
        "--enable-prefix-caching",
        "--async-scheduling",
        "--kv-cache-dtype fp8",
        "--load-format dummy",
        '"num_speculative_tokens": 7',
        "--max-num-batched-tokens 10240",
        "--worker-cls bench.serve.serve_worker.ServeWorker",
    ):
        assert flag in text
    assert "--kv-cache-dtype" not in server.command(_settings(), tmp_path, 1, "auto")
    assert server.capture_sizes(7) == [8, 16, 32, 64]


def test_the_gpu_memory_share_shrinks_with_the_resident_servers(tmp_path: Path) -> None:
    from bench.engine.arms import BY_NAME

    def share(arms: list[str]) -> float:
        chosen = _settings(arms=tuple(BY_NAME[a] for a in arms))
        argv = server.command(chosen, tmp_path, 1, "fp8")
        return float(argv[argv.index("--gpu-memory-utilization") + 1])

    one, two, three = share(["stock"]), share(["stock", "reset"]), share(ABC)
    assert one > two > three and three * 3 <= settings.RESIDENT_GPU_SHARE < 1


def test_server_environment_per_arm(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.engine.arms import BY_NAME

    monkeypatch.setenv("VLLM_CACHE_ROOT", "/c")
    env = server.environment(BY_NAME["reset"], Runner.V2, "/site-reset", _settings())
    assert env["VLLM_MAMBA_SR_SEED_PREFETCH"] == "1" and env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and env["SR_ENGINE_ARM"] == "reset"
    assert env["PYTHONPATH"].split(os.pathsep)[1:] == ["/site-reset", "/tmp/serve-site"]
    assert env["VLLM_CACHE_ROOT"] == "/c/serve-reset-v2"
    stock = server.environment(BY_NAME["stock"], Runner.V1, "/site", _settings())
    assert "VLLM_MAMBA_SR_SEED_PREFETCH" not in stock or stock["VLLM_MAMBA_SR_SEED_PREFETCH"] != "1"
    assert env["FLASHINFER_WORKSPACE_BASE"] == "/c/flashinfer-reset"
    assert stock["FLASHINFER_WORKSPACE_BASE"] == "/c/flashinfer-stock"


def test_bench_arguments_and_summary() -> None:
    shape = Shape("long", 1, 10, 10000, 128)
    argv = bench_client.argv(shape, 9, Path("/m"), Path("/r/x.json"), 2)
    pairs = dict(zip(argv, [*argv[1:], ""], strict=True))
    assert pairs["--random-input-len"] == "10000" and pairs["--top-p"] == "0.95"
    assert pairs["--temperature"] == "1.0" and "--ignore-eos" in argv and "--save-detailed" in argv
    kept = bench_client.summary(cpu_fakes.result(10, 128, 0.004))
    assert kept["median_tok_s_user"] == pytest.approx(127 / (31 * 0.004))
    bench_client.check(shape, kept)
    with pytest.raises(bench_client.BenchFailed, match="9 of 10"):
        bench_client.check(shape, {**kept, "completed": 9})


def test_identity_record_and_difference() -> None:
    reply = {
        "choices": [
            {
                "finish_reason": "length",
                "logprobs": {
                    "tokens": ["token_id:7", "token_id:9"],
                    "token_logprobs": [-1.5, -2.25],
                },
            }
        ]
    }
    record = identity.request_record(reply)
    assert record == {
        "tokens": [7, 9],
        "logprobs": [(-1.5).hex(), (-2.25).hex()],
        "finish_reason": "length",
    }
    a = {"requests": [record]}
    b = {"requests": [{**record, "tokens": [7, 8]}]}
    assert identity.first_difference(a, a) is None
    assert identity.first_difference(a, b) == "request 0, position 1: tokens 9 against 8"
    assert identity.prompts(32768) == identity.prompts(32768)
    assert min(min(p) for p in identity.prompts(32768)) >= 4


def test_tokenizer_round_trips_ids(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    folder = model_dir.write(tmp_path / "m", 7)
    config = json.loads((folder / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1 and config["max_position_embeddings"] >= 10128
    loaded = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert len(loaded) == config["vocab_size"] and loaded.num_special_tokens_to_add() == 0
    ids = [4, 5, 1000, config["vocab_size"] - 1]
    assert loaded(loaded.decode(ids), add_special_tokens=False).input_ids == ids
    assert "tokens" in model_dir.check_tokenizer(folder)


def test_the_sites_must_name_every_arms_copy() -> None:
    """Stock's copy is the site vLLM was staged in; each design's is its patched copy."""
    sites = {"stock": "/a", "reset": "/b", "forward-context": "/c"}
    assert run.check_sites(_settings(), sites) is sites
    with pytest.raises(run.SitesMissing, match="forward-context"):
        run.check_sites(_settings(), {"stock": "/a", "reset": "/b"})
    with pytest.raises(run.SitesMissing):
        run.check_sites(_settings(), None)


def test_gpu_samples_are_summarized_per_gpu_and_field(tmp_path: Path) -> None:
    text = (
        "0, 1980, 3201, 450.5, 51, 97\n0, 1755, 3201, 690.0, 55, 99\n"
        "bad line\n1, [N/A], 1, 1, 1, 1\n"
    )
    summary = gpu_clocks.summarize(text)
    assert list(summary) == ["0"]
    assert summary["0"]["clocks.sm"] == {"min": 1755, "median": 1867.5, "max": 1980, "n": 2}
    # Where the sampler's command is not on this machine, it samples nothing.
    with gpu_clocks.Sampler(tmp_path / "gpu.csv", ["no-such-nvidia-smi"]) as sampler:
        pass
    assert sampler.summary() == {}
    # A command that prints samples is read back after the block.
    argv = [sys.executable, "-c", f"print({text.splitlines()[0]!r}); import time; time.sleep(30)"]
    with gpu_clocks.Sampler(tmp_path / "gpu.csv", argv) as sampler:
        deadline = time.monotonic() + 20
        while not (tmp_path / "gpu.csv").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert sampler.summary()["0"]["power.draw"]["max"] == 450.5


def test_the_summary_keeps_each_requests_median_itl() -> None:
    result = {"itls": [[0.008, 0.009, 0.010], [0.014, 0.013]], "output_lens": [4, 3]}
    assert bench_client.summary(result)["request_median_itl_ms"] == [9.0, 13.5]


def test_host_load_over_a_block_from_two_proc_stat_reads(tmp_path: Path) -> None:
    before = "cpu  100 0 50 800 40 0 10 0 7 0\ncpu0 50 0 25 400 20 0 5 0 0 0\nintr 1\n"
    after = "cpu  400 0 150 1200 140 0 10 100 9 0\ncpu0 1 1 1 1 1 1 1 1 1 1\n"
    # 300 user + 100 system busy, 400 idle, 100 iowait, 100 steal: 1000 ticks.
    assert host_load.summarize(before, after) == {
        "busy_pct": 40.0,
        "iowait_pct": 10.0,
        "steal_pct": 10.0,
    }
    assert host_load.summarize(before, before) == {}
    assert host_load.summarize("intr 1\n", after) == {}
    with host_load.Window(tmp_path / "no-proc-stat") as window:
        pass
    assert window.summary() == {}
    stat = tmp_path / "stat"
    stat.write_text(before)
    with host_load.Window(stat) as window:
        stat.write_text(after)
    assert window.summary()["busy_pct"] == 40.0


def test_a_bad_serve_record_is_answered_in_one_line_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    prefix = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"^serve report: .*missing.json: \[Errno 2\]"):
        report.main([str(tmp_path / "missing.json"), "--prefix", str(prefix)])
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match=r"is not a serve run's records \(KeyError"):
        report.main([str(bad), "--prefix", str(prefix)])
    assert not list(tmp_path.glob("out*"))


def test_servers_warm_up_together_and_warm_ones_start_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm-up launches every arm's server at once; so does the round, whose servers
    are then all warm, each timed from its own launch."""
    events: list[str] = []
    launch, wait_ready = server.Server.launch.__func__, server.Server.wait_ready

    def logged_launch(cls, argv_for, env, log_path, pid_file=None):  # type: ignore[no-untyped-def]
        events.append(f"launch {log_path.stem}")
        return launch(cls, argv_for, env, log_path, pid_file)

    def logged_wait(self, timeout, poll=None):  # type: ignore[no-untyped-def]
        seconds = wait_ready(self, timeout, poll)
        events.append(f"ready {self.log.stem}")
        return seconds

    monkeypatch.setattr(server.Server, "launch", classmethod(logged_launch))
    monkeypatch.setattr(server.Server, "wait_ready", logged_wait)
    monkeypatch.setattr(run, "FIRST_START_GUESS_S", 150.0)  # 3 x 150 + 30 > 350
    data = _run(tmp_path, cpu_fakes.FakeClient(), budget_s=350.0, pairs=1).all()
    warm = [f"v1-warm-{arm}" for arm in ABC]
    cells = [f"v1-p1-{arm}" for arm in ABC]
    assert events == [
        *(f"launch {name}" for name in warm),
        *(f"ready {name}" for name in warm),
        *(f"launch {name}" for name in cells),
        *(f"ready {name}" for name in cells),
        "launch v1-p1-control-one-seed",  # alone, after the round's servers stopped
        "ready v1-p1-control-one-seed",
    ]
    launches = [data["cells"][f"v1/p1/{arm}"]["starts"][0] for arm in ABC]
    assert all(0 < s < 30 for s in launches)
    assert sorted(data["meta"]["warm_starts"]) == sorted(f"v1/{arm}" for arm in ABC)
