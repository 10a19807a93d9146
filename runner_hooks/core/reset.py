# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The Mamba SR seed prefetcher, told by the model runner where each forward is.

No CUDA graph draws: a forward's seeds are drawn as it begins, before a FULL
graph's capture or replay alike, into the one buffer its graph reads. Identity
with the SSU calls' per-call draws, value by value and in the CUDA generator's
offset:
- An eager forward draws what its N per-call draws would, advancing the offset
  by 4N.
- A replay: a graph of per-call draws draws from the offset and advances it by
  4N; here the replay's draws do, before it, and the graph reads them.
- A capture that begins inside the forward (V2's capture loop) draws nothing, as
  a capture of per-call draws advances nothing outside its graph. One that
  begins after the forward began (V1's graph wrapper, inside the runner's
  forward) is known at its first seed; the forward's draws are then taken back
  from the offset as it ends.
"""

from collections.abc import Hashable, Iterator
from contextlib import contextmanager

import torch

from .prefetch import SeedBatch, SeedPrefetch


class SRSeedPrefetcher:
    """The k-th `next_seed()` inside `forward()` returns seed k, drawn as the
    forward began. None (the caller draws its own, per call) outside a forward
    and beyond N."""

    def __init__(self, prefetch: SeedPrefetch) -> None:
        """`prefetch` draws the seeds."""
        self.prefetch = prefetch
        self._batch: SeedBatch | None = None
        # Per FULL graph captured in a forward: the seeds its replays draw.
        self._graph_seeds: dict[Hashable, int] = {}

    @contextmanager
    def forward(
        self, full_cudagraph: bool = False, captures: Hashable | None = None
    ) -> Iterator[None]:
        """Runs the body as one forward that calls the SSU once per Mamba-2
        layer. `full_cudagraph`: the body captures or replays a FULL CUDA graph;
        `captures`: the key of the FULL graph the body captures, whose replays
        `replay(captures)` draws for. A body that raises ends the forward too,
        so a failed capture leaves the generator where per-call draws would."""
        self._begin()
        try:
            yield
        finally:
            self._end(full_cudagraph, captures)

    def _begin(self) -> None:
        self._batch = self.prefetch.schedule()

    def _end(self, full_cudagraph: bool, captures: Hashable | None = None) -> None:
        batch, self._batch = self._batch, None
        if batch is None:
            return
        if captures is not None and batch.under_capture:
            self._graph_seeds[captures] = batch.consumed
        self.prefetch.finish(batch, full_cudagraph)

    def replay(self, graph: Hashable) -> None:
        """Draws the seeds the FULL graph captured as `graph` reads, before its
        replay; nothing for a graph no forward captured."""
        count = self._graph_seeds.get(graph)
        if count:
            self.prefetch.fill(count)

    def next_seed(self) -> torch.Tensor | None:
        batch = self._batch
        return None if batch is None else batch.take()
