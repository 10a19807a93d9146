# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The Mamba SR seed prefetcher, told by the model runner where each forward is."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .prefetch import SeedBatch, SeedPrefetch


class SRSeedPrefetcher:
    """The k-th `next_seed()` inside `forward()` returns seed k, drawn as the
    forward begins (a FULL graph: at its first call, inside the capture).
    None (the caller draws inline, as stock) outside a forward, beyond N calls,
    and under capture for seeds not drawn in it."""

    def __init__(self, prefetch: SeedPrefetch) -> None:
        """`prefetch` draws the seeds."""
        self.prefetch = prefetch
        self._batch: SeedBatch | None = None
        self._draw_at_first_seed = False

    @contextmanager
    def forward(self, full_cudagraph: bool = False) -> Iterator[None]:
        """Runs the body as one forward that calls the SSU once per Mamba-2
        layer; `full_cudagraph`: it is a FULL CUDA graph's capture or replay."""
        self._begin(full_cudagraph)
        try:
            yield
        except BaseException:
            self._batch, self._draw_at_first_seed = None, False
            raise
        self._end()

    def _begin(self, full_cudagraph: bool) -> None:
        self._batch, self._draw_at_first_seed = None, False
        if full_cudagraph:
            self._draw_at_first_seed = True
        else:
            self._batch = self.prefetch.schedule()

    def next_seed(self) -> torch.Tensor | None:
        batch = self._batch
        if batch is None:
            if not self._draw_at_first_seed:
                return None
            self._draw_at_first_seed = False
            batch = self._batch = self.prefetch.schedule()
        return batch.take()

    def _end(self) -> None:
        batch, self._batch, self._draw_at_first_seed = self._batch, None, False
        if batch is not None:
            self.prefetch.finish(batch)
