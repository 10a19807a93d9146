"""The designs with every drawer and sync plan: what the bench and tests compare.

`runner_hooks.core` (the reset design) and `runner_hooks.baseline` (the
forward-context design) are what lands in vLLM; the classes here extend them
with choices by name, which vLLM's copies do not carry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from . import hooks
from .baseline import prefetcher as baseline
from .baseline.prefetcher import NO_CUDA, cuda_device
from .baseline.side_stream import SideStreamSeedPrefetch, SyncPlan, UnjoinedCaptureError
from .core import reset
from .core.prefetch import SeedPrefetch
from .drawers import SeedDrawer, drawer_factory
from .sync import resolve_sync_plan

logger = logging.getLogger(__name__)

DEFAULT_SYNC_PLANS: dict[str, str] = {
    "kernel": "current_stream",
    "randint": "geometric",
}
"""Each drawer's plan when none is given, by measurement: with the kernel, the
current stream (eagerly, as mixed prefill/decode steps run the SSU even under
PIECEWISE graphs, ahead of a single side-stream event or tied; under graphs
within 1.5 µs of it, and never behind it in the engine); with randint, geometric
(per_seed's graph-mode gain at a far cheaper eager forward).  The figures:
bench/results/sync-plan-defaults.md.  A drawer not listed gets FALLBACK_SYNC_PLAN."""
FALLBACK_SYNC_PLAN = "geometric"


def _seed_prefetch(
    owner: object,
    num_ssu_calls: int,
    device: torch.device,
    plan: SyncPlan | None,
    make_drawer: Callable[[], SeedDrawer | str],
) -> SeedPrefetch | str:
    """The machinery for `plan` (None: the drawer's default), or why none."""
    drawer = make_drawer()
    if isinstance(drawer, str):
        return drawer
    if plan is None:
        plan = resolve_sync_plan(
            DEFAULT_SYNC_PLANS.get(drawer.name, FALLBACK_SYNC_PLAN)
        )
    name = type(owner).__name__
    if not plan.side_stream:
        return SeedPrefetch(name, num_ssu_calls, device, drawer.draw)
    return SideStreamSeedPrefetch(name, num_ssu_calls, device, drawer.draw, plan)


def plan_of(prefetch: SeedPrefetch) -> SyncPlan:
    """The sync plan a prefetch publishes its seeds by."""
    if isinstance(prefetch, SideStreamSeedPrefetch):
        return prefetch.plan
    return resolve_sync_plan("current_stream")


class _ByName:
    """Builds the machinery from the drawer and plan a variant was given."""

    _make_drawer: Callable[[], SeedDrawer | str]
    _sync_plan: SyncPlan | None

    def _seed_prefetch(
        self, num_ssu_calls: int, device: torch.device
    ) -> SeedPrefetch | str:
        return _seed_prefetch(
            self, num_ssu_calls, device, self._sync_plan, self._make_drawer
        )


class SRSeedPrefetcher(reset.SRSeedPrefetcher):
    """The reset design's prefetcher with a drawer and a sync plan by name.

    drawer: "auto" (the kernel where it builds, else inactive), "kernel",
    "randint", or a drawer; sync_plan: a name of SYNC_PLANS, a plan, or None
    for the drawer's DEFAULT_SYNC_PLANS entry. Inactive (`inactive_reason`
    says why) without CUDA or a drawer.
    """

    def __init__(
        self,
        num_ssu_calls: int,
        device: torch.device | str,
        *,
        sync_plan: str | SyncPlan | None = None,
        drawer: str | SeedDrawer = "auto",
    ) -> None:
        make_drawer = drawer_factory(drawer)
        plan = None if sync_plan is None else resolve_sync_plan(sync_plan)
        cuda = cuda_device(device, num_ssu_calls)
        made = (
            NO_CUDA
            if cuda is None
            else _seed_prefetch(self, num_ssu_calls, cuda, plan, make_drawer)
        )
        self.inactive_reason = made if isinstance(made, str) else None
        # Inactive: no prefetch, and every forward takes no seeds (see _begin).
        super().__init__(None if isinstance(made, str) else made)  # type: ignore[arg-type]

    def _begin(self, full_cudagraph: bool) -> None:
        if self.prefetch is None:
            self._batch, self._draw_at_first_seed = None, False
        else:
            super()._begin(full_cudagraph)

    def on_forward_begin(self, info: hooks.ForwardInfo) -> None:
        """As a hook of ForwardHooks: `forward()` for each forward that runs the
        SSU and is not micro-batched."""
        if info.runs_ssu and not info.micro_batched:
            self._begin(info.full_cudagraph)
        else:
            self._batch, self._draw_at_first_seed = None, False

    def on_forward_end(self, info: hooks.ForwardInfo) -> None:
        """Ends the forward, also one whose body raised (ForwardHooks logs
        what ending it raises then): a side stream is joined before a capture
        ends."""
        self._end()


class ForwardContextSeedPrefetcher(_ByName, baseline.ForwardContextSeedPrefetcher):
    """The forward-context design's prefetcher with a drawer and a plan by name."""

    def __init__(
        self,
        num_ssu_calls: int,
        device: torch.device | str,
        current_forward: Callable[[], object | None],
        *,
        is_micro_batched: Callable[[object], bool] = lambda forward: False,
        sync_plan: str | SyncPlan = "per_seed",
        drawer: str | SeedDrawer = "randint",
    ) -> None:
        self._make_drawer = drawer_factory(drawer)
        self._sync_plan = resolve_sync_plan(sync_plan)
        super().__init__(
            num_ssu_calls, device, current_forward, is_micro_batched=is_micro_batched
        )


class ForwardHooks(hooks.ForwardHooks):
    """The runner hooks; and where the body ended a CUDA graph capture with a side
    stream of a hook unjoined, the body's exception propagates as itself.

    V1 runs torch.cuda.graph inside the hooks: when the body raises under
    capture, the graph's exit ends the capture before the hooks can join the
    side stream, and CUDA's unjoined-stream error replaces the body's.  The
    hook's end then raises UnjoinedCaptureError; the body's exception is the
    context of CUDA's error, and is raised instead.
    """

    def __init__(self) -> None:
        super().__init__()
        self._unjoined: UnjoinedCaptureError | None = None

    def _end(
        self, info: hooks.ForwardInfo, begun: list[hooks.ForwardHook]
    ) -> list[tuple[hooks.ForwardHook, Exception]]:
        errors = super()._end(info, begun)
        self._unjoined = next(
            (e for _, e in errors if isinstance(e, UnjoinedCaptureError)), None
        )
        return errors

    @contextmanager
    def _forward(self, info: hooks.ForwardInfo) -> Iterator[None]:
        self._unjoined = None
        try:
            with super()._forward(info):
                yield
        except BaseException as failure:
            body = failure.__context__
            if self._unjoined is None or body is None:
                raise
            logger.warning(
                "ending the CUDA graph capture failed (%s) because the forward "
                "raised under capture; the forward's %s propagates",
                failure,
                type(body).__name__,
            )
            raise body from None
