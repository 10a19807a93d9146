"""bench/engine/worker.py: the engine process, its workloads and rank plumbing
(with fakes for vLLM)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from . import arms, compact, model, report, worker
from . import spans as engine_spans
from .arms import BY_NAME, IDENTITY_ARMS, STOCK, TIMING_ARMS, GraphMode, Runner
from .client import Worker
from .cpu_fakes import FakeGpu, mamba_metadata, runner_module


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
    record = compact.compact_record(got)
    assert record["tp"] == 2 and [s["rank"] for s in record["ranks"]] == [0, 1]
    assert report.compare(record, compact.compact_record(got)) == "identical"
    other = json.loads(json.dumps(got))
    other["ranks"][1]["fingerprints"][5] = "f" * 64
    assert report.compare(got, other) == "rank 1: state differs from step 5"
    other["ranks"][0]["state_sha256"] = "0" * 64
    assert report.compare(got, other) == "rank 0: state differ; rank 1: state differs from step 5"
    assert report.compare(got, {**got, "ranks": got["ranks"][:1]}).startswith("ranks [0] against")


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


@pytest.mark.parametrize("arm", ["control-one-seed", "reset-randint", "reset"])
def test_each_rank_process_gets_the_arms_environment(arm: str, tmp_path: Path) -> None:
    """A real worker process starts an engine at TP 2 whose ranks are spawned
    processes (a fake vLLM): each rank has NVLink multicast off, the arm's own
    variables and its GPUs, and is set up for the arm (the control's seed path,
    the variant's drawer and plan, or the landed prefetcher left in place) before
    its model would load."""
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
        sites={chosen.site: str(site)},
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
        variant = {"drawer": chosen.drawer}
        assert seen["prefetcher"] == (variant if chosen.drawer else None)


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


class _MixedEngine:
    """An LLMEngine of one rank whose every step runs one forward through the
    runner (its module's set_forward_context): the decodes, then the long
    prompts' chunks in the rest of `budget`; each forward takes HOST_S of the
    host's time to enqueue GPU_S of kernels, 40 piecewise replays among them."""

    HOST_S, GPU_S = 10e-3, 3e-3

    def __init__(self, monkeypatch, budget: int, max_model_len: int, mode=GraphMode.PIECEWISE):
        from types import SimpleNamespace as NS

        self.gpu = FakeGpu(monkeypatch)
        module, self.opened = runner_module(monkeypatch)
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
            monkeypatch.setattr(engine_spans, name, None)

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
        self.worker.model_runner.execute_model(mamba_metadata(decodes, prefills, chunk))
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
    assert engine_spans._REPLAYS.timing and not engine_spans._FORWARDS.watching
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
    assert not engine_spans._FORWARDS.watching and engine_spans._REPLAYS.timing


def test_a_profile_of_mixed_steps_checks_they_were_mixed(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _MixedEngine(monkeypatch, budget=128, max_model_len=1024)
    monkeypatch.setattr(worker, "_start_profile", lambda _worker: None)
    monkeypatch.setattr(worker, "_stop_profile", lambda _worker, steps: [["k", 1.0, 2.0]])
    engine = _mixed_engine(fake, monkeypatch)
    got = engine.profile(bs=2, steps=12, warm=0, workload="mixed")
    assert got == {"steps": 12, "kernels": [["k", 1.0, 2.0]]} and len(fake.opened) == 12
    assert engine_spans._REPLAYS.timing and not engine_spans._FORWARDS.watching
    with pytest.raises(ValueError, match="profile takes the workload decode or mixed"):
        engine.profile(bs=2, steps=12, warm=0, workload="prefill")
    fake.budget = 2  # the decodes fill it: no prefill chunk fits beside them
    with pytest.raises(RuntimeError, match="forward 0 ran 2 decodes and 0 prefills"):
        engine.profile(bs=2, steps=12, warm=0, workload="mixed")
    text = report.profile_markdown(
        {"workload": "mixed", "runners": {"v1": {"profile": {"stock": {"2": got}}}}}
    )
    assert "**v1, BS 2: GPU kernels per mixed step**" in text


class _Prefetch:
    """The SeedPrefetch a reset-design prefetcher draws with, as events."""

    def __init__(self, events: list[object]) -> None:
        self.events = events

    def schedule(self) -> Any:
        from types import SimpleNamespace as NS

        self.events.append("draw")
        return NS(under_capture=False, consumed=0)

    def fill(self, count: int) -> None:
        self.events.append(("fill", count))

    def finish(self, batch: Any, full_cudagraph: bool = False) -> None:
        self.events.append("finish")


def test_the_reset_designs_replays_are_timed_from_before_their_draw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reset design's prefetcher draws a FULL graph's seeds just before its
    replay: on V1 a FULL forward begun outside a capture opens the replay span
    before its draw and drops what no replay took as it ends; on V2 sr_seed_replay
    opens it before its fill.  Eager forwards and those begun inside a capture
    leave the spans alone; the prefetcher is wrapped once."""
    from runner_hooks.core.reset import SRSeedPrefetcher

    events: list[object] = []
    capturing = [False]
    monkeypatch.setattr(worker, "open_replay_early", lambda: events.append("open"))
    monkeypatch.setattr(worker, "close_replay_early", lambda: events.append("close"))
    monkeypatch.setattr(worker, "_capturing", lambda: capturing[0])
    prefetcher = SRSeedPrefetcher(_Prefetch(events))  # type: ignore[arg-type]
    worker._time_replays_from_the_draw(prefetcher)
    worker._time_replays_from_the_draw(prefetcher)  # once only
    with prefetcher.forward(full_cudagraph=True):
        events.append("replay")
    assert events == ["open", "draw", "replay", "finish", "close"]
    events.clear()
    with prefetcher.forward():
        pass
    capturing[0] = True
    with prefetcher.forward(full_cudagraph=True, captures="graph"):
        pass
    assert events == ["draw", "finish", "draw", "finish"]
    events.clear()
    capturing[0] = False
    prefetcher._graph_seeds["graph"] = 3
    prefetcher.replay("graph")
    assert events == ["open", ("fill", 3)]
    events.clear()
    with pytest.raises(RuntimeError), prefetcher.forward(full_cudagraph=True):
        raise RuntimeError("the forward failed")
    assert events == ["open", "draw", "finish", "close"]


def test_only_the_reset_designs_arms_time_from_the_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine installs each rank's timers with its arm's Arm.draws_before_replays."""
    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(
        worker.Engine, "_each_rank", lambda self, func, *args: calls.append((func, *args))
    )
    for name, draws in (("stock", False), ("reset", True), ("plugin", True)):
        calls.clear()
        engine = worker.Engine(BY_NAME[name], "/m")
        engine._install_timers()
        engine._install_timers()
        assert calls == [(worker._install_rank_timers, draws)], name


def test_a_ranks_timers_wrap_the_attached_prefetcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the arm draws before its replays, the prefetcher ssu_dispatch has
    attached is timed from the draw; none attached (the flag set but unused),
    nothing is."""
    import sys
    from types import SimpleNamespace as NS

    installed: list[object] = []
    wrapped: list[object] = []
    monkeypatch.setattr(worker, "_install_spans", installed.append)
    monkeypatch.setattr(worker, "_time_replays_from_the_draw", wrapped.append)
    ssu_dispatch = NS(_sr_seed_prefetcher="attached")
    monkeypatch.setitem(sys.modules, worker.SSU_DISPATCH, ssu_dispatch)
    worker._install_rank_timers("rank", False)
    worker._install_rank_timers("rank", True)
    assert installed == ["rank", "rank"] and wrapped == ["attached"]
    ssu_dispatch._sr_seed_prefetcher = None
    worker._install_rank_timers("rank", True)
    assert wrapped == ["attached"]
