"""One vLLM engine in this process, driven by commands on stdin (client.py).

    python -m bench.engine.worker --arm NAME --model-dir DIR --reply-fd FD [--tp N]

The process must already have its arm's environment (the vLLM copy on
PYTHONPATH, VLLM_USE_V2_MODEL_RUNNER, VLLM_MAMBA_SR_SEED_*, the GPUs in
CUDA_VISIBLE_DEVICES, VLLM_ENABLE_V1_MULTIPROCESSING=0 for an in-process
engine core): client.py sets it.  At TP N > 1 each rank is a process of
vLLM's multiprocessing executor, started with this one's environment; so
whatever the harness reads or times on the GPU runs on every rank through
vLLM's collective_rpc (at TP 1, on the one in-process worker: the same
path), each reply tagged with its rank (`by_rank`).  Each command is one
JSON line; each reply is one JSON line on FD (vLLM logs to stdout, so
replies do not go there):
{"ok": true, ...} or {"ok": false, "error": ...}.

    {"op": "start", "mode": "FULL_AND_PIECEWISE", "serving": "mtp7"}   build the engine
                                                    (drops the last; serving: an
                                                    arms.SERVINGS name, default plain;
                                                    step_tokens: arms.engine_kwargs')
    {"op": "identity"}                              the identity workload's record
    {"op": "decode", "bs": 4, "steps": 48, "warm": 4}   seconds per decode step (wall),
                                                    and every rank's GPU spans, merged
    {"op": "mixed", "bs": 4, "steps": 12, "warm": 4}    the same of steps that also
                                                    prefill a chunk, and the GPU time
                                                    of as many more (Engine.mixed)
    {"op": "profile", "bs": 1, "steps": 24, "warm": 4}  rank 0's GPU kernels of those
                                                    decode steps (torch.profiler), per step
                                                    ("workload": "mixed": of mixed steps)
    {"op": "autotune"}                              every rank's Triton autotuning picks
                                                    of the Mamba kernels and Inductor's
                                                    (autotune.py)
    {"op": "quit"}
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import math
import os
import random
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import arms, autotune, model
from .arms import GraphMode, Perturb
from .envs import ARM_ENV, LLM_KWARGS_ENV, TORCH_DETERMINISTIC_ENV
from .spans import (
    RankError,
    _install_spans,
    _median,
    _start_profile,
    _stop_profile,
    _synchronize,
    _take_forwards,
    _take_spans,
    _watch_forwards,
    close_replay_early,
    merge_forward_gpu,
    merge_spans,
    mixed_batch_error,
    open_replay_early,
)
from .state import (
    _logprobs,
    layer_sums,
    rng_offset,
    sanity,
    slot_sums,
    state_fingerprint,
    state_sha256,
    zero_states,
)

# The identity workload: requests of mixed prompt lengths arriving over the
# run (engine step at which each is added), up to 8 running at once, long
# prompts chunked (max_num_batched_tokens=256) into steps that also decode.
PROMPT_LENGTHS = (5, 37, 300, 12, 180, 700, 64, 9, 450, 23, 90, 150)
ARRIVAL_STEPS = (0, 0, 0, 3, 6, 10, 17, 25, 33, 41, 50, 60)
MAX_TOKENS = (80, 96, 64, 72, 100, 40, 88, 70, 50, 96, 64, 56)
PROMPT_SEED = 7
LAYER_STEPS = 3
TIMING_PROMPT_LENGTH = 32
# Under prefix caching, these requests' prompts start with one shared prefix
# of SHARED_PREFIX_BLOCKS of the engine's blocks (known once it has started),
# so that the later three find the first's state at a block boundary in the
# cache: in align mode the last block boundary a prompt's state is cached at
# is its last full block's, one block earlier under MTP (the scheduler of
# vLLM 0.20.0 and 0.26.0 backs off a block for drafters that take the
# target's hidden states), so 2.5 blocks leave one cached either way.
SHARED_PREFIX_REQUESTS = (0, 5, 8, 10)
SHARED_PREFIX_BLOCKS = 2.5
# The counters an identity record keeps (Engine.counters).
COUNTER_PREFIXES = ("vllm:spec_decode_num_", "vllm:prefix_cache_")


def prompts(lengths: tuple[int, ...], vocab: int, seed: int = PROMPT_SEED) -> list[list[int]]:
    """Token ids, the same in every process (no tokenizer: ids 3.. vocab-1)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for length in lengths]


class _OneSeedPerturbed:
    """Stands in for ssu_dispatch's `torch`: every `every`-th randint (layer 0
    of each decode forward) comes back XOR 1.  Under CUDA graphs the XOR is
    captured with the draw, so replays carry it too."""

    def __init__(self, torch_module: Any, every: int) -> None:
        self._torch = torch_module
        self._every = every
        self._calls = 0

    def randint(self, *args: Any, **kwargs: Any) -> Any:
        seed = self._torch.randint(*args, **kwargs)
        self._calls += 1
        return seed ^ 1 if self._calls % self._every == 1 else seed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


class _NoDraw:
    """Stands in for ssu_dispatch's `torch`: randint returns one constant
    tensor per device, made at its first call (a profile or warm-up forward,
    before any capture), so no seed kernel runs at all."""

    def __init__(self, torch_module: Any) -> None:
        self._torch = torch_module
        self._seeds: dict[Any, Any] = {}

    def randint(self, low: int, high: int, size: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device not in self._seeds:
            self._seeds[device] = self._torch.full(
                size, 0x5EED, dtype=kwargs.get("dtype", self._torch.int64), device=device
            )
        return self._seeds[device]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


class _OneDraw(_NoDraw):
    """_NoDraw, plus one one-element draw from the default generator at every
    `every`-th randint (the first SSU call of each forward, inside its graph
    where captured): the floor of a path that draws from that generator."""

    def __init__(self, torch_module: Any, every: int) -> None:
        super().__init__(torch_module)
        self._every = every
        self._calls = 0
        self._draws: dict[Any, Any] = {}

    def randint(self, low: int, high: int, size: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if self._calls % self._every == 0:
            if device not in self._draws:
                self._draws[device] = self._torch.empty(1, dtype=self._torch.int64, device=device)
            self._draws[device].random_(low, high)
        self._calls += 1
        return super().randint(low, high, size, **kwargs)


def _replace_ssu_torch(perturb: Perturb, every: int) -> None:
    import torch
    from vllm.model_executor.layers.mamba.ops import ssu_dispatch

    if perturb is Perturb.ONE_SEED:
        ssu_dispatch.torch = _OneSeedPerturbed(torch, every)
    elif perturb is Perturb.NO_DRAW:
        ssu_dispatch.torch = _NoDraw(torch)
    elif perturb is Perturb.ONE_DRAW:
        ssu_dispatch.torch = _OneDraw(torch, every)


def _variant_prefetcher(prefetch: Any, *, drawer: str) -> Any:
    """bench.variants' ResetPrefetcherByName of the size and device of the SeedPrefetch
    that the patched vLLM hands its own."""
    from bench.variants import ResetPrefetcherByName

    return ResetPrefetcherByName(prefetch.num_seeds, prefetch.device, drawer=drawer)


def _use_variant(drawer: str) -> None:
    """The patched vLLM attaches bench.variants' ResetPrefetcherByName with this drawer
    in place of its vendored one, which has the seed kernel's."""
    import functools

    from vllm.model_executor.layers.mamba.ops import ssu_dispatch

    from bench.drawers import drawer_factory

    # An unknown name fails here, not in the engine.
    drawer_factory(drawer)
    ssu_dispatch.SRSeedPrefetcher = functools.partial(  # type: ignore[misc]
        _variant_prefetcher, drawer=drawer
    )


SSU_DISPATCH = "vllm.model_executor.layers.mamba.ops.ssu_dispatch"
"""The module where the patched vLLM (or the plugin) attaches its seed prefetcher,
as `_sr_seed_prefetcher`."""


def _capturing() -> bool:
    import torch

    return torch.cuda.is_current_stream_capturing()


@contextlib.contextmanager
def _replay_span_closed_after(body: contextlib.AbstractContextManager[Any]) -> Iterator[None]:
    """`body`, then the replay span it opened early dropped if no replay took it."""
    try:
        with body:
            yield
    finally:
        close_replay_early()


def _time_replays_from_the_draw(prefetcher: Any) -> None:
    """`prefetcher`, the reset design's (runner_hooks/core/reset.py SRSeedPrefetcher
    as it lands, or bench.variants' in its place), has each FULL graph replay start
    the timing's replay span before the seeds drawn for it (spans.open_replay_early):
    those draws stand in for the ones stock's graph makes inside its replay, so the
    span must hold them as stock's holds its own.  On V1 a replay runs inside a FULL
    forward, `forward(full_cudagraph=True)` begun outside a capture, which draws as
    it begins; on V2 it follows `replay(graph)` (sr_seed_replay, just before
    run_fullgraph).  Eager and PIECEWISE forwards, and forwards begun inside a
    capture (V2's), keep the spans as they are.  Once per prefetcher: an engine
    started again in this process may keep the one attached before."""
    if getattr(prefetcher, "_sr_replays_timed", False):
        return
    forward, replay = prefetcher.forward, prefetcher.replay

    def timed_forward(full_cudagraph: bool = False, captures: Any = None) -> Any:
        if not full_cudagraph or _capturing():
            return forward(full_cudagraph, captures)
        open_replay_early()
        return _replay_span_closed_after(forward(full_cudagraph, captures))

    def timed_replay(graph: Any) -> None:
        open_replay_early()
        replay(graph)

    prefetcher.forward, prefetcher.replay = timed_forward, timed_replay
    prefetcher._sr_replays_timed = True


def _install_rank_timers(worker: Any, draws_before_replays: bool) -> None:
    """This rank's timers (spans._install_spans); where its arm draws before its
    replays (Arm.draws_before_replays), the attached prefetcher's replays timed from
    before their draws (_time_replays_from_the_draw).  Run once the engine has
    started: the plugin serves ssu_dispatch only as vLLM imports it."""
    _install_spans(worker)
    if draws_before_replays:
        ssu_dispatch = importlib.import_module(SSU_DISPATCH)
        prefetcher = getattr(ssu_dispatch, "_sr_seed_prefetcher", None)
        if prefetcher is not None:
            _time_replays_from_the_draw(prefetcher)


_PREPARED = False


def prepare_rank() -> None:
    """Sets this process up for the arm $SR_ENGINE_ARM names, once: torch's
    deterministic algorithms where $SR_ENGINE_TORCH_DETERMINISTIC asks, the
    controls' and the floor's seed path, the arm's drawer.  Run by main
    before the engine starts, and by every rank's vLLM worker
    (rank_worker.RankWorker) before its model loads: under TP a rank is a
    process of its own (forked, it has all this already)."""
    global _PREPARED
    if _PREPARED:
        return
    deterministic = os.environ.get(TORCH_DETERMINISTIC_ENV)
    if deterministic in ("1", "nofill"):
        import torch

        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = deterministic == "1"
    arm = arms.BY_NAME[os.environ[ARM_ENV]]
    if arm.perturb in (Perturb.ONE_SEED, Perturb.NO_DRAW, Perturb.ONE_DRAW):
        _replace_ssu_torch(arm.perturb, model.mamba2_layers())
    if arm.drawer is not None:
        _use_variant(arm.drawer)
    _PREPARED = True


def _on_rank(worker: Any, func: Callable[..., Any], *args: Any) -> tuple[int, Any]:
    """A collective_rpc target: func(worker, *args) on one rank, with its rank."""
    return worker.rank, func(worker, *args)


def _on_model(worker: Any, func: Callable[[Any], Any]) -> Any:
    """func(model) with the rank's model, as vLLM's apply_model calls it."""
    return func(worker.get_model())


def by_rank(replies: Sequence[tuple[int, Any]], tp: int) -> list[Any]:
    """The values of `_on_rank` replies in rank order; every rank 0..tp-1 once."""
    ranks = sorted(rank for rank, _ in replies)
    if ranks != list(range(tp)):
        raise RankError(f"expected one reply from each of ranks 0..{tp - 1}; got ranks {ranks}")
    return [value for _, value in sorted(replies, key=lambda reply: reply[0])]


def _rank_picks(worker: Any) -> dict[str, dict[str, str]]:
    return autotune.picks() | autotune.inductor_picks()


def _init_weights(worker: Any) -> int:
    """model.init_weights on this rank's shard, from a seed of the rank's own
    (WEIGHT_SEED at rank 0, as at TP 1): ranks hold different weights."""
    return model.init_weights(worker.get_model(), model.WEIGHT_SEED + worker.rank)


class Engine:
    def __init__(self, arm: arms.Arm, model_dir: str, tp: int = 1) -> None:
        self.arm = arm
        self.model_dir = model_dir
        self.tp = tp
        self.llm: Any = None
        self.timed = False  # whether this engine's ranks have their timers
        self.config = model.model_config(tp)
        self.serving = arms.PLAIN

    def start(
        self, mode: str, serving: str = arms.PLAIN.name, step_tokens: int | None = None
    ) -> dict:
        from vllm import LLM

        self.stop()
        self.serving = arms.SERVING_BY_NAME[serving]
        seed = 1 if self.arm.perturb is Perturb.GENERATOR_SEED else arms.SEED
        began = time.perf_counter()
        model_dir = (
            str(model.mtp_model_dir(self.model_dir))
            if self.serving.speculative_tokens
            else self.model_dir
        )
        kwargs = arms.engine_kwargs(
            model_dir, GraphMode(mode), seed, self.tp, self.serving, step_tokens
        )
        kwargs.update(json.loads(os.environ.get(LLM_KWARGS_ENV) or "{}"))
        self.llm = LLM(**kwargs)
        counts = self._each_rank(_init_weights)
        self.timed = False
        return {"start_s": time.perf_counter() - began, "parameters": counts[0]}

    def autotune_picks(self) -> dict:
        """Every rank's Triton autotuning picks of the Mamba kernels and Inductor's
        (autotune.picks, autotune.inductor_picks)."""
        return {"picks": self._each_rank(_rank_picks)}

    def block_size(self) -> int:
        """The engine's KV-cache block in tokens (under prefix caching in align
        mode, also the Mamba state's)."""
        return int(self.llm.llm_engine.vllm_config.cache_config.block_size)

    def counters(self) -> dict[str, float]:
        """vLLM's speculative-decoding and prefix-cache counters (summed over
        their labels) as they stand; none for an engine without stat logging
        (PLAIN: arms.serving_kwargs turns it on for the others).  The counters
        are the process's, so a workload's are a difference."""
        from vllm.v1.metrics.reader import Counter

        if not self.llm.llm_engine.log_stats:
            return {}
        totals: dict[str, float] = {}
        for metric in self.llm.get_metrics():
            if isinstance(metric, Counter) and metric.name.startswith(COUNTER_PREFIXES):
                totals[metric.name] = totals.get(metric.name, 0) + metric.value
        return totals

    def identity_prompts(self) -> list[list[int]]:
        """The identity workload's prompts; under prefix caching, those of
        SHARED_PREFIX_REQUESTS after one shared prefix of SHARED_PREFIX_BLOCKS."""
        tokens = prompts(PROMPT_LENGTHS, self.config["vocab_size"])
        if not self.serving.prefix_caching:
            return tokens
        shared_length = int(self.block_size() * SHARED_PREFIX_BLOCKS)
        (shared,) = prompts((shared_length,), self.config["vocab_size"], seed=PROMPT_SEED + 1)
        return [
            shared + ids if i in SHARED_PREFIX_REQUESTS else ids for i, ids in enumerate(tokens)
        ]

    def _each_rank(self, func: Callable[..., Any], *args: Any) -> list[Any]:
        """func(worker, *args) on every TP rank's vLLM worker, in rank order."""
        return by_rank(self.llm.llm_engine.collective_rpc(_on_rank, args=(func, *args)), self.tp)

    def stop(self) -> None:
        if self.llm is None:
            return
        llm, self.llm = self.llm, None
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()

    def _params(self, max_tokens: int, logprobs: int | None) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            temperature=1.0,
            max_tokens=max_tokens,
            ignore_eos=True,
            detokenize=False,
            logprobs=logprobs,
        )

    def identity(self) -> dict:
        engine = self.llm.llm_engine
        pending = list(
            zip(
                ARRIVAL_STEPS,
                (f"r{i}" for i in range(len(PROMPT_LENGTHS))),
                self.identity_prompts(),
                MAX_TOKENS,
                strict=False,
            )
        )
        produced: dict[str, int] = {}
        finals: dict[str, Any] = {}
        cached_tokens: dict[str, int] = {}
        decoded_steps: list[bool] = []
        # Per TP rank, its own Mamba-2 state: its share of every layer's heads.
        ranks: list[dict[str, Any]] = [
            {"rank": rank, "fingerprints": [], "layer_sums": [], "slot_sums": [], "rng_offsets": []}
            for rank in range(self.tp)
        ]

        def keep(name: str, func: Callable[[Any], Any]) -> list[Any]:
            values = self._each_rank(_on_model, func)
            for state, value in zip(ranks, values, strict=True):
                state[name].append(value)
            return values

        self._each_rank(_on_model, zero_states)
        keep("rng_offsets", rng_offset)
        counted = self.counters()
        step = 0
        while pending or engine.has_unfinished_requests():
            while pending and pending[0][0] <= step:
                _, rid, ids, max_tokens = pending.pop(0)
                engine.add_request(rid, {"prompt_token_ids": ids}, self._params(max_tokens, 1))
            decoded = False
            for out in engine.step():
                completion = out.outputs[0]
                before = produced.get(out.request_id, 0)
                if before and len(completion.token_ids) > before:
                    decoded = True
                produced[out.request_id] = len(completion.token_ids)
                finals[out.request_id] = completion
                cached_tokens[out.request_id] = out.num_cached_tokens or 0
            decoded_steps.append(decoded)
            sums = self._each_rank(_on_model, layer_sums)
            for state, rank_sums in zip(ranks, sums, strict=True):
                state["fingerprints"].append(state_fingerprint(rank_sums))
                if step < LAYER_STEPS:
                    state["layer_sums"].append(rank_sums)
            if step < LAYER_STEPS:
                keep("slot_sums", slot_sums)
                keep("rng_offsets", rng_offset)
            step += 1
            if step > 2000:
                raise RuntimeError("the identity workload did not finish in 2000 steps")
        shas = self._each_rank(_on_model, state_sha256)
        for state, sha in zip(ranks, shas, strict=True):
            state["state_sha256"] = sha
        return {
            "steps": step,
            "decode_steps": sum(decoded_steps),
            # Per step: whether a request got a token past its first (a decode ran).
            "decoded": decoded_steps,
            "tp": self.tp,
            # Per rank, in rank order: "fingerprints" per step; each layer's
            # sums for the first steps ("layer_sums": where two runs part, the
            # first layer that differs says where in the forward they did),
            # and each slot's ("slot_sums"); the generator's offset before the
            # workload and after each of those steps ("rng_offsets": equal in
            # two processes unless engine start, or a step, drew differently);
            # the state's bytes at the end ("state_sha256").
            "ranks": ranks,
            "sanity": sanity(finals),
            # Per request, its prompt tokens found in the prefix cache.
            "cached_tokens": dict(sorted(cached_tokens.items())),
            "block_size": self.block_size(),
            # What the workload added to vLLM's speculative-decoding and
            # prefix-cache counters (drafts, draft and accepted tokens; queries, hits).
            "counters": {
                name: value - counted.get(name, 0)
                for name, value in sorted(self.counters().items())
            },
            "tokens": {rid: list(c.token_ids) for rid, c in sorted(finals.items())},
            "logprobs": {rid: _logprobs(c) for rid, c in sorted(finals.items())},
        }

    @contextlib.contextmanager
    def _decoding(self, bs: int, steps: int, warm: int) -> Iterator[Any]:
        """A decode batch of `bs` requests past `warm` steps of prefill and first
        decodes, with room for `steps` more (of up to 1 + K tokens each under
        MTP); aborted and drained on exit."""
        engine = self.llm.llm_engine
        ids = [f"t{time.monotonic_ns()}-{i}" for i in range(bs)]
        tokens = prompts((TIMING_PROMPT_LENGTH,) * bs, self.config["vocab_size"])
        room = (warm + steps) * (1 + self.serving.speculative_tokens) + 8
        for rid, prompt in zip(ids, tokens, strict=False):
            engine.add_request(rid, {"prompt_token_ids": prompt}, self._params(room, None))
        for _ in range(warm):
            engine.step()
        try:
            yield engine
        finally:
            engine.abort_request(ids)
            while engine.has_unfinished_requests():
                engine.step()

    def decode(self, bs: int, steps: int, warm: int) -> dict:
        """`steps` decode steps' wall time, and every rank's spans merged
        (merge_spans).  Under MTP a step is a verify iteration: the verify
        forward and the drafter's."""
        with self._decoding(bs, steps, warm) as engine:
            return self._timed(engine, steps)[0]

    @contextlib.contextmanager
    def _mixing(self, bs: int, steps: int, warm: int) -> Iterator[tuple[Any, list[str]]]:
        """_decoding's batch with long prompts (one token to generate) queued
        behind it, enough to fill each step's token budget
        (max_num_batched_tokens) past the last of `steps`; yields the engine
        and the prompts' ids, aborted on exit."""
        config = self.llm.llm_engine.vllm_config
        budget = config.scheduler_config.max_num_batched_tokens
        length = config.model_config.max_model_len - 8
        count = math.ceil((steps + 2) * budget / length) + 1
        with self._decoding(bs, steps, warm) as engine:
            ids = [f"p{time.monotonic_ns()}-{i}" for i in range(count)]
            long_prompts = prompts((length,) * count, self.config["vocab_size"])
            for rid, prompt in zip(ids, long_prompts, strict=True):
                engine.add_request(rid, {"prompt_token_ids": prompt}, self._params(1, None))
            try:
                yield engine, ids
            finally:
                engine.abort_request(ids)

    def mixed(self, bs: int, steps: int, warm: int) -> dict:
        """Two bursts of `steps` steps, each with a prefill chunk beside the
        `bs` decodes (_mixing).  A mixed batch is no uniform decode, so under
        FULL_AND_PIECEWISE it runs the piecewise graphs, the SSU eager between
        them.  The first burst gives decode's figures (replays counted, not
        timed); the second each forward's GPU time behind spins (forward_gpu_s:
        ForwardGpuSpans, merge_forward_gpu).  Every forward of both must have
        been such a step (mixed_batch_error)."""
        with self._mixing(bs, 2 * steps, warm) as (engine, ids):
            with self._watching(spin=False):
                figures, finished = self._timed(engine, steps)
                batches = self._each_rank(_take_forwards)[0]["batches"]
            with self._watching(spin=True):
                finished |= self._steps(engine, steps)
                spun = self._each_rank(_take_forwards)
            # The spun steps' execute_model spans hold their spins: dropped.
            self._each_rank(_take_spans)
        done = len(finished & set(ids))
        if done == len(ids):
            raise RuntimeError(
                f"all {len(ids)} prefills finished within {2 * steps} steps: not mixed"
            )
        batches += spun[0]["batches"]
        if error := mixed_batch_error(batches, bs):
            raise RuntimeError(error)
        return {
            **figures,
            **merge_forward_gpu(spun),
            "prefills": len(ids),
            "prefills_done": done,
            "prefill_tokens": _median(batch[3] for batch in batches),
        }

    @contextlib.contextmanager
    def _watching(self, spin: bool) -> Iterator[None]:
        """Every rank's forwards watched (and spun) while inside (_watch_forwards)."""
        self._install_timers()
        self._each_rank(_watch_forwards, spin)
        try:
            yield
        finally:
            self._each_rank(_watch_forwards, None)

    def _install_timers(self) -> None:
        if not self.timed:  # the identity workload runs without timers
            self._each_rank(_install_rank_timers, self.arm.draws_before_replays)
            self.timed = True

    def _steps(self, engine: Any, steps: int) -> set[str]:
        """Runs `steps` engine steps; returns the requests that finished in them."""
        finished: set[str] = set()
        for _ in range(steps):
            finished.update(out.request_id for out in engine.step() if out.finished)
        return finished

    def _timed(self, engine: Any, steps: int) -> tuple[dict, set[str]]:
        """`steps` engine steps' figures, and the requests that finished in them."""
        self._install_timers()
        self._each_rank(_take_spans)  # what came before
        began = time.perf_counter()
        finished = self._steps(engine, steps)
        self._each_rank(_synchronize)
        elapsed = time.perf_counter() - began
        ranks = self._each_rank(_take_spans)
        figures = {
            "step_s": elapsed / steps,
            **merge_spans(ranks),
            "replays_per_step": ranks[0]["replays"] / steps,
        }
        return figures, finished

    def profile(self, bs: int, steps: int, warm: int, workload: str = "decode") -> dict:
        """Rank 0's GPU kernels over `steps` decode steps of a batch of `bs`
        (workload "mixed": steps with a prefill chunk beside them, as mixed
        times them), as torch's profiler sees them (kernels inside CUDA graph
        replays included); every rank runs under the profiler alike."""
        if workload == "decode":
            with self._decoding(bs, steps, warm) as engine:
                kernels = self._profiled(engine, steps)
        elif workload == "mixed":
            with self._mixing(bs, steps, warm) as (engine, _), self._watching(spin=False):
                kernels = self._profiled(engine, steps)
                batches = self._each_rank(_take_forwards)[0]["batches"]
            if error := mixed_batch_error(batches, bs):
                raise RuntimeError(error)
        else:
            raise ValueError(f"profile takes the workload decode or mixed; got {workload!r}")
        return {"steps": steps, "kernels": kernels}

    def _profiled(self, engine: Any, steps: int) -> list[list[Any]]:
        self._each_rank(_start_profile)
        self._steps(engine, steps)
        return self._each_rank(_stop_profile, steps)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", required=True, choices=sorted(arms.BY_NAME))
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--reply-fd", type=int, required=True)
    parser.add_argument("--tp", type=int, default=1, choices=model.TP_SIZES)
    args = parser.parse_args(argv)
    replies = os.fdopen(args.reply_fd, "w", buffering=1)
    os.environ[ARM_ENV] = args.arm
    prepare_rank()
    engine = Engine(arms.BY_NAME[args.arm], args.model_dir, args.tp)
    replies.write(json.dumps({"ok": True, "ready": args.arm, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op == "quit":
            break
        try:
            if op == "start":
                reply = engine.start(**command)
            elif op == "identity":
                reply = engine.identity()
            elif op == "decode":
                reply = engine.decode(**command)
            elif op == "mixed":
                reply = engine.mixed(**command)
            elif op == "profile":
                reply = engine.profile(**command)
            elif op == "autotune":
                reply = engine.autotune_picks()
            else:
                raise ValueError(f"unknown op {op!r}")
            reply = {"ok": True, **reply}
        except Exception as error:
            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        replies.write(json.dumps(reply) + "\n")
    engine.stop()
    return 0


if __name__ == "__main__":
    # As bench.engine.worker, not __main__: the functions collective_rpc sends
    # to the ranks' processes are pickled by their module's name.
    from bench.engine import worker

    raise SystemExit(worker.main())
