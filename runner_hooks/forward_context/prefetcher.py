# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Forwards told apart by the identity of the current forward context."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from ..core.prefetch import SeedBatch, SeedPrefetch
from .side_stream import PER_SEED, SideStreamSeedPrefetch

NO_CUDA = "no CUDA device"


def cuda_device(device: torch.device | str, num_seeds: int) -> torch.device | None:
    """The CUDA device to prefetch `num_seeds` seeds on, or None without CUDA."""
    if type(num_seeds) is not int or num_seeds < 1:
        raise ValueError(f"num_ssu_calls must be a positive int, got {num_seeds!r}")
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    if device.index is None:
        device = torch.device("cuda", torch.accelerator.current_device_index())
    return device


class SeedPrefetcher:
    """A prefetcher's machinery, `prefetch`, or None and why (`inactive_reason`)."""

    def __init__(self, num_ssu_calls: int, device: torch.device | str) -> None:
        cuda = cuda_device(device, num_ssu_calls)
        made = NO_CUDA if cuda is None else self._seed_prefetch(num_ssu_calls, cuda)
        self.prefetch = None if isinstance(made, str) else made
        self.inactive_reason = made if isinstance(made, str) else None

    def _seed_prefetch(
        self, num_ssu_calls: int, device: torch.device
    ) -> SeedPrefetch | str:
        """The machinery for `num_ssu_calls` seeds on `device`, or why none."""
        raise NotImplementedError


class RandintDrawer:
    """One stock draw per seed: `random_` on each one-element view, as
    `torch.randint(0, 2**32, (1,))` runs on the tensor it allocates."""

    name = "randint"

    def draw(self, out: torch.Tensor) -> None:
        for seed in out.split(1):
            seed.random_(0, 2**32)


class ForwardContextSeedPrefetcher(SeedPrefetcher):
    """Draws a forward's N seeds at its first `next_seed()` under a new context.

    A forward is the object `current_forward()` returns, held by weakref so a
    dead one is never mistaken for a new one at its address; the k-th call
    under it returns seed k. None (the caller draws inline, as stock) when
    `current_forward()` is None, for micro-batched forwards, beyond N, while
    inactive, and under capture for seeds not drawn in it. With no end
    signal, a forward that left seeds unconsumed is closed when the next one
    is first seen.
    """

    def __init__(
        self,
        num_ssu_calls: int,
        device: torch.device | str,
        current_forward: Callable[[], object | None],
        *,
        is_micro_batched: Callable[[object], bool] = lambda forward: False,
    ) -> None:
        super().__init__(num_ssu_calls, device)
        self._current_forward = current_forward
        self._is_micro_batched = is_micro_batched
        self._forward: weakref.ref[object] | None = None
        self._batch: SeedBatch | None = None

    def _seed_prefetch(
        self, num_ssu_calls: int, device: torch.device
    ) -> SeedPrefetch | str:
        owner = type(self).__name__
        drawer = RandintDrawer()
        return SideStreamSeedPrefetch(
            owner, num_ssu_calls, device, drawer.draw, PER_SEED
        )

    def next_seed(self) -> torch.Tensor | None:
        if self.prefetch is None:
            return None
        forward = self._current_forward()
        if forward is None:
            return None
        if self._forward is None or self._forward() is not forward:
            self._begin(forward)
        if self._batch is None:
            return None
        return self._batch.take()

    def _begin(self, forward: object) -> None:
        previous, self._batch = self._batch, None
        self._forward = weakref.ref(forward)
        if previous is not None:
            self.prefetch.finish(previous)  # type: ignore[union-attr]
        if not self._is_micro_batched(forward):
            self._batch = self.prefetch.schedule()  # type: ignore[union-attr]
