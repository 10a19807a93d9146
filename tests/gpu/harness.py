"""A model-runner stand-in that runs forwards of SSU calls through stock or a design.

Every identity test runs the same script twice from the same generator state:
once through stock (inline `torch.randint` before each SSU call) and once
through a prefetcher, and compares what the consumers actually read.  The
consumer of seed k is a copy into `record[k]` enqueued on the forward's
stream after the SSU call's other work, just where the SSU kernel would read
its `rand_seed`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from bench.variants import (
    BodyFirstForwardHooks,
    ForwardContextPrefetcherByName,
    ResetPrefetcherByName,
)
from runner_hooks.hooks import ForwardInfo

NUM_LAYERS = 12
"""Mamba-2 layers per forward: enough for a geometric plan of five events."""

DECODE = ForwardInfo(runs_ssu=True)
PREFILL = ForwardInfo(runs_ssu=False)
FULL_GRAPH = ForwardInfo(runs_ssu=True, full_cudagraph=True)
MICRO_BATCHED = ForwardInfo(runs_ssu=True, micro_batched=True)


class Forward:
    """Stands in for vLLM's ForwardContext: one object per forward."""

    def __init__(self, info: ForwardInfo) -> None:
        self.info = info


class Runner:
    """Runs forwards of `NUM_LAYERS` SSU calls; `design` None is stock, else "reset",
    "forward-context", "outside-graph" (bench/outside_graph.py) or "checked-once"
    (bench/checked_once.py)."""

    def __init__(
        self,
        design: str | None,
        sync_plan: str | None = None,
        drawer: str = "randint",
        num_layers: int = NUM_LAYERS,
        batch_size: int = 1,
    ) -> None:
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.num_layers = num_layers
        self.hooks = BodyFirstForwardHooks()
        self.current: Forward | None = None
        self.prefetcher: Any
        if design == "reset":
            self.prefetcher = ResetPrefetcherByName(
                num_layers,
                self.device,
                sync_plan=sync_plan,
                drawer=drawer,
            )
            self.hooks.register(self.prefetcher)
        elif design in ("outside-graph", "checked-once"):
            from bench.checked_once import checked_once_prefetcher
            from bench.drawers import resolve_drawer
            from bench.outside_graph import outside_graph_prefetcher

            made = resolve_drawer(drawer)
            assert made is not None, drawer
            make = (
                outside_graph_prefetcher if design == "outside-graph" else checked_once_prefetcher
            )
            self.prefetcher = make(num_layers, self.device, made.draw)
            self.hooks.register(self.prefetcher)
        elif design == "forward-context":
            self.prefetcher = ForwardContextPrefetcherByName(
                num_layers,
                self.device,
                lambda: self.current,
                is_micro_batched=lambda forward: forward.info.micro_batched,  # type: ignore[attr-defined]
                sync_plan=sync_plan or "per_seed",
                drawer=drawer,
            )
        else:
            assert design is None, design
            self.prefetcher = None
        self.activations = torch.ones(batch_size, 1 << 14, device=self.device)

    @contextmanager
    def forward(self, info: ForwardInfo) -> Iterator[None]:
        """One forward: the runner's hook for the reset design, a new context for the
        forward-context design."""
        self.current = Forward(info)
        try:
            with self.hooks.forward(info):
                yield
        finally:
            self.current = None

    def seed(self) -> torch.Tensor:
        """What the patched SSU backend does: the prefetched seed, else stock's inline draw."""
        seed = self.prefetcher.next_seed() if self.prefetcher is not None else None
        return seed if seed is not None else torch.randint(0, 2**32, (1,), device=self.device)

    def layers(self, record: torch.Tensor, calls: int | None = None, sleep_cycles: int = 0) -> None:
        """`calls` SSU calls, each after other work; record[k] reads seed k."""
        for k in range(self.num_layers if calls is None else calls):
            self.activations.mul_(1.0001).add_(1.0)  # the conv1d before each SSU
            seed = self.seed()
            if sleep_cycles:
                torch.cuda._sleep(sleep_cycles)  # a slow consumer stream
            record[k : k + 1].copy_(seed)

    def new_record(self, calls: int | None = None) -> torch.Tensor:
        size = self.num_layers if calls is None else calls
        return torch.zeros(size, dtype=torch.int64, device=self.device)

    def decode(self, calls: int | None = None, info: ForwardInfo = DECODE) -> torch.Tensor:
        """One eager forward; returns the seeds its consumers read."""
        record = self.new_record(calls)
        with self.forward(info):
            self.layers(record, calls)
        return record


Script = Callable[[Runner], list[torch.Tensor]]


def run_both(
    script: Script, make_runner: Callable[[str | None], Runner], seed: int = 1234
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Runs `script` through stock and through the design from one generator state.

    Also asserts that both leave the generator in the same state, so later
    RNG users see what they would see under stock.
    """
    results, states = [], []
    for design in (None, "design"):
        runner = make_runner(design)
        torch.cuda.synchronize()
        torch.cuda.manual_seed(seed)
        records = script(runner)
        torch.cuda.synchronize()
        results.append([record.cpu() for record in records])
        states.append(torch.cuda.get_rng_state())
    assert torch.equal(states[0], states[1]), "the generator ends where stock leaves it"
    return results[0], results[1]


def assert_same_seeds(stock: list[torch.Tensor], ours: list[torch.Tensor]) -> None:
    """Value by value; also that the values are fresh draws, not a constant."""
    assert len(stock) == len(ours)
    for index, (expected, got) in enumerate(zip(stock, ours, strict=True)):
        assert torch.equal(expected, got), (
            f"record {index}: stock read {expected.tolist()}, the design read {got.tolist()}"
        )
    values = torch.cat(stock).tolist()
    assert len(set(values)) == len(values), "stock seeds repeat: the script draws nothing fresh"


def require_drawer(name: str) -> None:
    """Skips, with the reason, a test of a drawer that cannot be built here."""
    from bench.drawers import resolve_drawer

    try:
        resolve_drawer(name)
    except RuntimeError as reason:
        pytest.skip(f"drawer {name!r} unavailable: {reason}")
