"""The two ways of telling one forward from the next.

Both designs prefetch a forward's N seeds through the same `SeedPrefetch`
(drawing, waiting, buffer lifetimes); they differ only in how a forward is
delimited:

* `SRSeedPrefetcher` (ours, explicit reset): the model runner says where each
  forward begins and ends through `ForwardHooks`, so the draws are scheduled
  as the forward begins, before its first Mamba layer, and a forward that did
  not consume its seeds is caught as it ends.
* `ForwardContextSeedPrefetcher` (the seed document's baseline): no runner
  change; a forward is recognised at its first SSU call by the identity of the
  runner's current forward context object (held by weakref, so a dead context
  cannot be mistaken for a new one at the same address), and draws then.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from .drawers import SeedDrawer, drawer_factory
from .hooks import ForwardInfo
from .prefetch import SeedBatch, SeedPrefetch
from .sync import SyncPlan, resolve_sync_plan

DEFAULT_SYNC_PLANS: dict[str, str] = {
    "kernel": "current_stream",
    "randint": "geometric",
}
"""Each drawer's plan when none is given, by measurement (bench/results,
nvidia-h200-20261130 and -20261130b: medians with 95% intervals over 150 and
100 shuffled rounds): with the kernel, the current stream is the fastest
eagerly (1728 against 1815 µs for a single event on a side stream at BS 1,
b), and under graphs it ties a single event at BS 4 and 8, is ahead at BS 2
and 1.2 µs behind at BS 1 (b); with randint, geometric gives up a few points
of per_seed's graph-mode gain for an eager forward far cheaper than
per_seed's.  The patched vLLM engine agrees (graph replay time of a decode
step, bench/results/engine-nvidia-h200x2-20261130g.md and -h.md, 10
interleaved rounds): the kernel on a side stream with a single event was 7-13
µs behind the current stream on both runners in run g and within 2 µs of it
in run h, never ahead; eager forwards, which mixed prefill/decode steps are
even under PIECEWISE graphs, are faster on the current stream.  A drawer not
listed gets FALLBACK_SYNC_PLAN."""
FALLBACK_SYNC_PLAN = "geometric"


NO_CUDA = "no CUDA device"
NO_DRAWER = "no seed drawer is faster than stock's per-call draw here"


def _seed_prefetch(
    owner: object,
    num_ssu_calls: int,
    device: torch.device | str,
    sync_plan: str | SyncPlan | None,
    drawer: str | SeedDrawer,
    check_offsets: bool = False,
) -> SeedPrefetch | str:
    """The shared machinery, or why seeds are not prefetched: no CUDA, or the
    "auto" drawer found none that beats stock's per-call draw."""
    if (
        isinstance(num_ssu_calls, bool)
        or not isinstance(num_ssu_calls, int)
        or num_ssu_calls < 1
    ):
        raise ValueError(f"num_ssu_calls must be a positive int, got {num_ssu_calls!r}")
    make_drawer = drawer_factory(drawer)
    plan = None if sync_plan is None else resolve_sync_plan(sync_plan)
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return NO_CUDA
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    built_drawer = make_drawer()
    if built_drawer is None:
        return NO_DRAWER  # drawers.py has logged why
    if plan is None:
        plan = resolve_sync_plan(
            DEFAULT_SYNC_PLANS.get(built_drawer.name, FALLBACK_SYNC_PLAN)
        )
    return SeedPrefetch(
        type(owner).__name__, num_ssu_calls, device, built_drawer, plan, check_offsets
    )


class _Prefetcher:
    """What both designs are made of: the shared machinery, or None when disabled."""

    def __init__(
        self,
        num_ssu_calls: int,
        device: torch.device | str,
        sync_plan: str | SyncPlan | None,
        drawer: str | SeedDrawer,
        check_offsets: bool = False,
    ) -> None:
        made = _seed_prefetch(
            self, num_ssu_calls, device, sync_plan, drawer, check_offsets
        )
        self._prefetch = None if isinstance(made, str) else made
        self.inactive_reason = made if isinstance(made, str) else None
        """Why this prefetcher is disabled (NO_CUDA, NO_DRAWER), or None."""

    @property
    def enabled(self) -> bool:
        return self._prefetch is not None

    @property
    def prefetch(self) -> SeedPrefetch | None:
        """The shared machinery (drawer, sync plan, device), or None when disabled."""
        return self._prefetch


class SRSeedPrefetcher(_Prefetcher):
    """Explicit-reset design: a forward hook that prefetches each forward's seeds.

    As a forward that runs the SSU begins, its N seeds are scheduled on the
    side stream; the k-th `next_seed()` of the forward returns seed k.  For a
    FULL CUDA graph the draws wait for the forward's first `next_seed()`, so
    that they land inside the graph being captured; a replay runs no Python,
    calls no `next_seed()` and draws nothing.

    `next_seed()` returns None (the caller then draws inline, as stock) outside
    a forward, for forwards that do not run the SSU or are micro-batched,
    beyond N calls, when disabled (no CUDA device), and under capture for seeds
    not drawn inside that capture.
    """

    def __init__(
        self,
        num_ssu_calls: int,
        device: torch.device | str,
        *,
        sync_plan: str | SyncPlan | None = None,
        drawer: str | SeedDrawer = "auto",
        check_offsets: bool = False,
    ) -> None:
        super().__init__(num_ssu_calls, device, sync_plan, drawer, check_offsets)
        self._batch: SeedBatch | None = None
        self._draw_at_first_seed = False

    def on_forward_begin(self, info: ForwardInfo) -> None:
        self._batch, self._draw_at_first_seed = None, False
        if self._prefetch is None or not info.runs_ssu or info.micro_batched:
            return
        if info.full_cudagraph:
            self._draw_at_first_seed = True
        else:
            self._batch = self._prefetch.schedule()

    def next_seed(self) -> torch.Tensor | None:
        batch = self._batch
        if batch is None:
            if not self._draw_at_first_seed:
                return None
            self._draw_at_first_seed = False
            batch = self._batch = self._prefetch.schedule()  # type: ignore[union-attr]
        return batch.take()

    def on_forward_end(self, info: ForwardInfo) -> None:
        batch, self._batch, self._draw_at_first_seed = self._batch, None, False
        if batch is not None:
            self._prefetch.finish(batch)  # type: ignore[union-attr]


class ForwardContextSeedPrefetcher(_Prefetcher):
    """Baseline design (the seed document's): forwards told apart by context identity.

    The first `next_seed()` under a forward object not seen before (from
    `current_forward()`) schedules that forward's N seeds; later calls under
    the same object take them by index.  None (inline stock draw) when
    `current_forward()` returns None, for micro-batched forwards, beyond N,
    when disabled, and under capture for seeds not drawn inside it.  With no
    end-of-forward signal, a forward that left seeds unconsumed is reported
    when the next forward is first seen.
    """

    def __init__(
        self,
        num_ssu_calls: int,
        device: torch.device | str,
        current_forward: Callable[[], object | None],
        *,
        is_micro_batched: Callable[[object], bool] = lambda forward: False,
        sync_plan: str | SyncPlan = "per_seed",
        drawer: str | SeedDrawer = "randint",
        check_offsets: bool = False,
    ) -> None:
        super().__init__(num_ssu_calls, device, sync_plan, drawer, check_offsets)
        self._current_forward = current_forward
        self._is_micro_batched = is_micro_batched
        self._forward: weakref.ref[object] | None = None
        self._batch: SeedBatch | None = None

    def next_seed(self) -> torch.Tensor | None:
        if self._prefetch is None:
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
            self._prefetch.finish(previous)  # type: ignore[union-attr]
        if not self._is_micro_batched(forward):
            self._batch = self._prefetch.schedule()  # type: ignore[union-attr]
