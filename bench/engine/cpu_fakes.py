"""Stand-ins the engine harness's CPU tests share: records, workers, engines, a GPU."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest
import torch

from . import session
from .arms import BY_NAME, Runner
from .client import WorkerError


def fake_record(fingerprints: list[str], tokens: list[int]) -> dict:
    return {
        "steps": len(fingerprints),
        "decode_steps": len(fingerprints) - 1,
        "fingerprints": fingerprints,
        "state_sha256": fingerprints[-1] * 4,
        "tokens": {"r0": tokens},
        "logprobs": {"r0": [[t, "0x1p-1"] for t in tokens]},
    }


class QuickWorker:
    """A worker that answers at once, logging every call into `calls`."""

    def __init__(self, name: str, calls: list[tuple[str, str, dict]]) -> None:
        self.name, self.calls = name, calls

    def call(self, op: str, **args: object) -> dict:
        self.calls.append((self.name, op, args))
        if op == "profile":
            return {"steps": args["steps"], "kernels": [["k", 1.0, 2.0]]}
        if op == "autotune":
            return {"picks": [{}]}
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


class FakeWorker:
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
        return fake_record(["a" * 64, self.name.ljust(64, "x")], [1])

    def engagement(self) -> list[str]:
        return [f"line of {self.name}"]

    def close(self) -> None:
        self.closed = True


class FakeGpu:
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
        monkeypatch.setattr(time, "perf_counter", lambda: self.host)

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


def runner_module(monkeypatch: pytest.MonkeyPatch) -> tuple[object, list[object]]:
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


def mamba_metadata(decodes: int, prefills: int, prefill_tokens: int) -> dict:
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


class FakeInstance:
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
        if op == "autotune":
            return {"picks": [{}]}
        offset = self.n * 1e-6
        return {"forward_gpu_s": 5e-3 + offset, "replay_s": 1e-3 + offset, "instance": self.n}

    def engagement(self) -> list[str]:
        return []

    def close(self) -> None:
        self.log.append(("close", self.name, self.n))
        self.closed = True


def instance_spawn(log: list[tuple], fail_spawn=(), fail_start=()):
    """timing.run's spawn: a new FakeInstance per (arm, runner) per call; the
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
                else FakeInstance(name, n, log, (name, n) in fail_start)
            )
        return workers

    return spawn


def timing_settings(tmp_path: Path, runners=tuple(Runner), names=("stock", "floor")):
    arms_ = tuple(BY_NAME[name] for name in names)
    return session.Settings({}, ("0",), tmp_path, runners, arms_)
