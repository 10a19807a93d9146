# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The seed prefetcher of a model runner's forward hooks."""

import functools

import torch

from .hooks import ForwardInfo
from .prefetch import SeedBatch, SeedDrawer, SeedPrefetch, SeedPrefetcher


@functools.cache
def kernel_drawer() -> SeedDrawer | str:
    """The one-kernel drawer, built once per process; else why it cannot be."""
    from .seed_kernel import KernelDrawer, SeedKernelUnavailable

    try:
        return KernelDrawer()
    except SeedKernelUnavailable as reason:
        return f"the seed kernel is unavailable: {reason}"


class SRSeedPrefetcher(SeedPrefetcher):
    """A forward hook: the k-th `next_seed()` of a forward returns seed k, drawn
    as the forward begins (a FULL graph: at its first call, inside the capture).
    None (the caller draws inline, as stock) outside a forward, for forwards that
    do not run the SSU or are micro-batched, beyond N calls, while inactive, and
    under capture for seeds not drawn in it."""

    _batch: SeedBatch | None = None
    _draw_at_first_seed = False

    def _seed_prefetch(
        self, num_ssu_calls: int, device: torch.device
    ) -> SeedPrefetch | str:
        drawer = kernel_drawer()
        if isinstance(drawer, str):
            return drawer
        return SeedPrefetch(type(self).__name__, num_ssu_calls, device, drawer)

    def on_forward_begin(self, info: ForwardInfo) -> None:
        self._batch, self._draw_at_first_seed = None, False
        if self.prefetch is None or not info.runs_ssu or info.micro_batched:
            return
        if info.full_cudagraph:
            self._draw_at_first_seed = True
        else:
            self._batch = self.prefetch.schedule()

    def next_seed(self) -> torch.Tensor | None:
        batch = self._batch
        if batch is None:
            if not self._draw_at_first_seed:
                return None
            self._draw_at_first_seed = False
            batch = self._batch = self.prefetch.schedule()  # type: ignore[union-attr]
        return batch.take()

    def on_forward_end(self, info: ForwardInfo) -> None:
        batch, self._batch, self._draw_at_first_seed = self._batch, None, False
        if batch is not None:
            self.prefetch.finish(batch)  # type: ignore[union-attr]
