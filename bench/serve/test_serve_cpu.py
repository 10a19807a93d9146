"""The serve harness on CPU: fake servers (cpu_fakes.py, real processes and HTTP) and a
fake vllm bench serve; the plan, the resume after a cut, the KV fallback, the
identity verdicts and the report."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from bench.engine.arms import Runner

from . import (
    bench_client,
    cpu_fakes,
    gpu_clocks,
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


@pytest.fixture(autouse=True)
def _quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "POLL_S", 0.05)


def _settings(**changes: object) -> Settings:
    base = dict(shapes=SHAPES, pairs=2, start_timeout=30.0, warmups=0)
    return Settings(**{**base, **changes})


def _run(
    tmp_path: Path,
    client: cpu_fakes.FakeClient,
    extra_env: dict[str, str] | None = None,
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


def test_plan_leads_with_stock_and_puts_the_control_in_its_rounds() -> None:
    steps = [
        (r.value, p, a.name, [s.name for s in shapes])
        for r, p, a, shapes in run.plan(_settings(long_pairs=(1,)))
    ]
    assert steps == [
        ("v1", 1, "stock", ["c1", "c8", "long"]),
        ("v1", 1, "reset", ["c1", "c8", "long"]),
        ("v1", 1, "forward-context", ["c1", "c8", "long"]),
        ("v1", 1, "control-one-seed", []),
        ("v1", 2, "stock", ["c1", "c8"]),
        ("v1", 2, "reset", ["c1", "c8"]),
        ("v1", 2, "forward-context", ["c1", "c8"]),
    ]


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
    monkeypatch.setenv("SR_SERVE_ARMS", "reset")
    with pytest.raises(settings.SettingsError, match="must hold stock"):
        settings.from_env()


def test_a_full_run_records_every_part_and_judges_them(tmp_path: Path) -> None:
    client = cpu_fakes.FakeClient()
    data = _run(tmp_path, client).all()
    assert sorted(data["cells"]) == sorted(
        [f"v1/p{p}/{a}" for p in (1, 2) for a in ("stock", "reset", "forward-context")]
        + ["v1/p1/control-one-seed"]
    )
    assert len(client.calls) == 6 * 3  # 6 measured servers x 3 shapes; the control runs none
    stock = data["cells"]["v1/p1/stock"]
    assert set(stock["bench"]) == {"c1", "c8", "long"}
    assert stock["bench"]["c8"]["median_tok_s_user"] == pytest.approx(15 / (3 * 0.01))
    assert "generated_texts" not in stock["bench"]["c8"]
    verdicts = judge.verdicts(data)
    assert verdicts and all(ok for _, ok, _ in verdicts), judge.failed(data)
    names = {name for name, _, _ in verdicts}
    assert "control differs [control-one-seed-v1-p1]" in names
    assert "stock is reproducible [v1-p1-p2]" in names
    assert "engagement line [reset-v1-p2]" in names
    saved = json.loads((tmp_path / "out" / "serve.json").read_text())
    assert saved == json.loads((tmp_path / "resume" / "serve.json").read_text())
    assert not list((tmp_path / "resume" / "serve-pids").glob("*.pid"))


def test_a_cut_run_resumes_where_it_stopped(tmp_path: Path) -> None:
    first = cpu_fakes.FakeClient(stop_after=4)
    with pytest.raises(run.Stopped):
        _run(tmp_path, first).all()
    cut = records.load(tmp_path / "resume" / "serve.json")
    assert set(cut["cells"]["v1/p1/stock"]["bench"]) == {"c1", "c8", "long"}
    assert set(cut["cells"]["v1/p1/reset"].get("bench", {})) == {"c1"}
    second = cpu_fakes.FakeClient()
    data = _run(tmp_path, second).all()
    assert len(second.calls) == 18 - 4
    assert [c[c.index("--max-concurrency") + 1] for c in second.calls[:2]] == [
        "8",
        "1",
    ]  # reset's c8, long
    assert all(ok for _, ok, _ in judge.verdicts(data))


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


def test_the_report_pools_rounds_and_shows_each_rounds_change(tmp_path: Path) -> None:
    client = cpu_fakes.FakeClient()
    runner = _run(tmp_path, client, pairs=2)
    # The patched arms' servers answer 10 % faster chunks in round 1, 20 % in round 2.
    original = runner.shape

    def shape(cell, srv, key, shape):
        gap = {"stock": 0.01, "reset": 0.009 if cell["pair"] == 1 else 0.008}.get(cell["arm"], 0.01)
        client.gap_for[srv.port] = gap
        original(cell, srv, key, shape)

    runner.shape = shape
    data = runner.all()
    text = report.markdown(data)
    assert (
        "| ITL p50 (ms) | 10 | 8.5 (-15.0 %; -10.0 %, -20.0 %) | 10 (+0.0 %; +0.0 %, +0.0 %) |"
        in text
    )
    assert "## v1, shape long" in text and "| identical to stock [reset-v1-p1] | pass |" in text
    prefix = tmp_path / "serve-x"
    assert report.main([str(tmp_path / "out" / "serve.json"), "--prefix", str(prefix)]) == 0
    assert (
        json.loads(Path(f"{prefix}.serve.json").read_text())["cells"].keys() == data["cells"].keys()
    )


def test_the_budget_stops_before_a_server_that_would_not_fit(tmp_path: Path) -> None:
    data = _run(tmp_path, cpu_fakes.FakeClient(), budget_s=1.0).all()
    assert data["cells"] == {}


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
