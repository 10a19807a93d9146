"""A model-runner stand-in that runs forwards of SSU calls through stock or a design.

Every identity test runs the same script twice from the same generator state:
once through stock (inline `torch.randint` before each SSU call) and once
through a prefetcher, and compares what the consumers actually read.  The
consumer of seed k is a copy into `record[k]` enqueued on the forward's
stream after the SSU call's other work, just where the SSU kernel would read
its `rand_seed`.

FULL CUDA graphs are captured and replayed as vLLM's runners do (CAPTURE_STYLES):
the reset design draws no seed inside any graph, so every replay of a graph it
captured is preceded by its draw, a forward opened around the replay (V1) or its
`replay(key)` (V2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from bench.sync import SYNC_PLANS
from bench.variants import (
    ForwardContextPrefetcherByName,
    ResetPrefetcherByName,
)
from runner_hooks.hooks import ForwardHooks, ForwardInfo

NUM_LAYERS = 12
"""Mamba-2 layers per forward: enough for a geometric plan of five events."""

DECODE = ForwardInfo(runs_ssu=True)
PREFILL = ForwardInfo(runs_ssu=False)
FULL_GRAPH = ForwardInfo(runs_ssu=True, full_cudagraph=True)
MICRO_BATCHED = ForwardInfo(runs_ssu=True, micro_batched=True)

FORWARD_CONTEXT_PLANS = tuple(sorted(SYNC_PLANS))
"""The forward-context design's sync plans (it draws on a side stream). The reset
design has none: it draws on the forward's stream."""

TRITON_DRAWER = "triton"
OUTSIDE_GRAPHS_ONLY = (
    "the Triton drawer reads the generator's offset on the host, which a capture "
    "refuses: only the reset design, which draws outside every graph, uses it"
)

CAPTURE_STYLES = ("v1", "hook_inside", "v2")
"""How a FULL graph is captured, and so replayed:

- "v1": V1's CUDAGraphWrapper: the runner's forward (its hooks, full_cudagraph=True)
  opens before the capture begins; each replay runs inside such a forward, whose
  hook draws the replay's seeds before the graph.
- "hook_inside": the forward opens inside the capture; replays as "v1".
- "v2": V2's capture loop: the forward opens inside the capture, for the reset
  design `prefetcher.forward(captures=key)`, which records the graph; each replay
  runs with no forward around it (V2's run_fullgraph), after the reset design's
  `prefetcher.replay(key)`.
"""


class Forward:
    """Stands in for vLLM's ForwardContext: one object per forward."""

    def __init__(self, info: ForwardInfo) -> None:
        self.info = info


@dataclass(eq=False)
class Captured:
    """A captured FULL graph, how it was captured, and the record its consumers write.
    Hashed by identity: the reset design's key for the graph (style "v2")."""

    graph: torch.cuda.CUDAGraph
    style: str
    record: torch.Tensor


class Runner:
    """Runs forwards of `NUM_LAYERS` SSU calls; `design` None is stock, else "reset"
    (runner_hooks.core behind the runner hooks; it draws on the forward's stream, so
    takes no `sync_plan`) or "forward-context" (with a side-stream `sync_plan`,
    default per_seed)."""

    def __init__(
        self,
        design: str | None,
        sync_plan: str | None = None,
        drawer: str = "randint",
        num_layers: int = NUM_LAYERS,
        batch_size: int = 1,
    ) -> None:
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.design = design
        self.num_layers = num_layers
        self.hooks = ForwardHooks()
        self.current: Forward | None = None
        self.prefetcher: Any
        if design == "reset":
            if sync_plan is not None:
                raise ValueError(
                    f"the reset design draws on the forward's stream; got sync plan {sync_plan!r}"
                )
            self.prefetcher = ResetPrefetcherByName(num_layers, self.device, drawer=drawer)
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

    def capture(
        self, record: torch.Tensor, style: str = "v1", calls: int | None = None, **graph_kwargs
    ) -> Captured:
        """Captures one forward of `calls` SSU calls as a FULL graph, in `style`
        (CAPTURE_STYLES); its consumers write `record`."""
        captured = Captured(torch.cuda.CUDAGraph(), style, record)
        if style == "v1":
            with self.forward(FULL_GRAPH), torch.cuda.graph(captured.graph, **graph_kwargs):
                self.layers(record, calls)
        else:
            with torch.cuda.graph(captured.graph, **graph_kwargs), self._captured_forward(captured):
                self.layers(record, calls)
        return captured

    def _captured_forward(self, captured: Captured) -> AbstractContextManager[None]:
        """The forward opened inside a capture ("hook_inside", "v2")."""
        if captured.style == "v2" and self.design == "reset":
            # As V2's capture loop calls sr_seed_forward(..., captures=desc).
            return self.prefetcher.forward(captures=captured)
        assert captured.style in CAPTURE_STYLES, captured.style
        return self.forward(FULL_GRAPH)

    def replay(self, captured: Captured) -> torch.Tensor:
        """Replays a captured graph as its style's runner does, its seeds drawn first
        (by the reset design); returns what its consumers read."""
        if captured.style == "v2":
            if self.design == "reset":
                self.prefetcher.replay(captured)  # V2's sr_seed_replay(desc)
            captured.graph.replay()
        else:
            with self.forward(FULL_GRAPH):
                captured.graph.replay()
        return captured.record.clone()


Script = Callable[[Runner], list[torch.Tensor]]


def run_both(
    script: Script, make_runner: Callable[[str | None], Runner], seed: int = 1234
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Runs `script` through stock and through the design from one generator state.

    Also asserts that both leave the generator in the same state (its seed and
    offset), so later RNG users see what they would see under stock.
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
