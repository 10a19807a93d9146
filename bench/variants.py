"""The bench's variants: each design with every drawer and sync plan by name, and where
each layer's rand_seed comes from in the microbenchmark.

`runner_hooks.core` (the reset design) and `runner_hooks.forward_context` (the forward-context
design) are what lands in vLLM, with one drawer and plan each; the classes here extend
them with choices by name, which vLLM's copies do not carry: ResetPrefetcherByName,
ForwardContextPrefetcherByName, and BodyFirstForwardHooks (the runner hooks, where a
forward that raised under capture propagates its own exception).  The microbenchmark's
variants:

* stock: `torch.randint(0, 2**32, (1,))` inline before each SSU, as vLLM
  0.33.0's FlashInferSSUBackend does.
* forward-context: the forward-context design, `ForwardContextPrefetcherByName`, with
  its defaults (one event per seed, randint drawer); a forward is told apart
  by the identity of a fresh object per step, standing in for vLLM's
  ForwardContext.
* reset-<plan>-<drawer>: the reset design, `ResetPrefetcherByName` behind `BodyFirstForwardHooks`,
  for every sync plan in `bench.sync.SYNC_PLANS` and every drawer in
  `bench.drawers.DRAWERS` found at run time, so new ones join the
  bench without edits here.
* reset-outside-graph: bench/outside_graph.py behind `BodyFirstForwardHooks`, with the
  kernel drawer: each forward's seeds drawn eagerly as its hook fires, a replay's
  too (`around_replay`), into one buffer every graph reads; no graph draws.
* reset-checked-once: bench/checked_once.py, with the kernel drawer: the capture
  and stream checks at a forward's first and last seed only.
* floor-rng: the floor plus one one-element draw from the default generator
  per forward, the drawing floor (summary.FLOOR_RNG says what it costs);
* floor: one fixed seed tensor, nothing drawn; the no-RNG-cost reference.

The two floors' seeds are fixed by design, so they are exempt from the seed check.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch

from runner_hooks import hooks
from runner_hooks.core import reset
from runner_hooks.core.prefetch import SeedPrefetch
from runner_hooks.forward_context import prefetcher as forward_context
from runner_hooks.forward_context.prefetcher import NO_CUDA, cuda_device
from runner_hooks.forward_context.side_stream import (
    SideStreamSeedPrefetch,
    SyncPlan,
    UnjoinedCaptureError,
)
from runner_hooks.hooks import ForwardInfo

from .drawers import DRAWERS, SEED_HIGH, SeedDrawer, drawer_factory
from .summary import FLOOR, FLOOR_RNG, STOCK
from .sync import SYNC_PLANS, resolve_sync_plan
from .synthetic_model import DecodeModel

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
        plan = resolve_sync_plan(DEFAULT_SYNC_PLANS.get(drawer.name, FALLBACK_SYNC_PLAN))
    name = type(owner).__name__
    if not plan.side_stream:
        return SeedPrefetch(name, num_ssu_calls, device, drawer.draw)
    return SideStreamSeedPrefetch(name, num_ssu_calls, device, drawer.draw, plan)


class _ByName:
    """Builds the machinery from the drawer and plan a variant was given."""

    _make_drawer: Callable[[], SeedDrawer | str]
    _sync_plan: SyncPlan | None

    def _seed_prefetch(self, num_ssu_calls: int, device: torch.device) -> SeedPrefetch | str:
        return _seed_prefetch(self, num_ssu_calls, device, self._sync_plan, self._make_drawer)


class ResetPrefetcherByName(reset.SRSeedPrefetcher):
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


class ForwardContextPrefetcherByName(_ByName, forward_context.ForwardContextSeedPrefetcher):
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
        super().__init__(num_ssu_calls, device, current_forward, is_micro_batched=is_micro_batched)


class BodyFirstForwardHooks(hooks.ForwardHooks):
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
        self._unjoined = next((e for _, e in errors if isinstance(e, UnjoinedCaptureError)), None)
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


class SeedSource(Protocol):
    """One variant's seed path: how a forward is delimited, and where each seed comes from."""

    def forward_scope(self, captured: bool) -> AbstractContextManager[object]:
        """Wraps one forward; `captured` when it is being captured into a FULL CUDA graph."""
        ...

    def seed(self) -> torch.Tensor:
        """The rand_seed for the next SSU call of the current forward."""
        ...


class StockSource:
    """vLLM 0.33.0's FlashInferSSUBackend: a fresh randint before every SSU call."""

    def __init__(self, device: torch.device) -> None:
        self._device = device

    def forward_scope(self, captured: bool) -> AbstractContextManager[object]:
        return nullcontext()

    def seed(self) -> torch.Tensor:
        return torch.randint(0, SEED_HIGH, (1,), device=self._device)


class FloorSource:
    """One seed tensor for every call: the step without any RNG cost."""

    def __init__(self, device: torch.device) -> None:
        self._seed = torch.randint(0, SEED_HIGH, (1,), device=device)

    def forward_scope(self, captured: bool) -> AbstractContextManager[object]:
        return nullcontext()

    def seed(self) -> torch.Tensor:
        return self._seed


class DrawingFloorSource(FloorSource):
    """The floor plus one one-element draw from the default generator as each forward
    begins (inside the graph when captured): the least any path that draws
    stock's seeds from that generator can cost."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self._draw = torch.empty(1, dtype=torch.int64, device=device)

    def forward_scope(self, captured: bool) -> AbstractContextManager[object]:
        self._draw.random_(0, SEED_HIGH)
        return nullcontext()


def _prefetched_or_stock(
    next_seed: Callable[[], torch.Tensor | None], device: torch.device
) -> torch.Tensor:
    """The call-site pattern of the vLLM patch: the prefetched seed, or stock's inline draw."""
    seed = next_seed()
    if seed is None:
        seed = torch.randint(0, SEED_HIGH, (1,), device=device)
    return seed


class _Forward:
    """Stands in for vLLM's ForwardContext: a fresh object per forward (and per capture)."""


class ContextIdentitySource:
    """The forward-context design: forwards told apart by the current forward object's identity."""

    def __init__(self, num_layers: int, device: torch.device) -> None:
        self._device = device
        self._current: _Forward | None = None
        self._prefetcher = ForwardContextPrefetcherByName(
            num_ssu_calls=num_layers, device=device, current_forward=lambda: self._current
        )

    @contextmanager
    def _scope(self) -> Iterator[None]:
        # As vLLM's set_forward_context: a new context for the forward, None after it.
        self._current = _Forward()
        try:
            yield
        finally:
            self._current = None

    def forward_scope(self, captured: bool) -> AbstractContextManager[object]:
        return self._scope()

    def seed(self) -> torch.Tensor:
        return _prefetched_or_stock(self._prefetcher.next_seed, self._device)


class ResetSource:
    """The reset design: the runner's ForwardHooks tell the prefetcher where each forward
    begins and ends."""

    def __init__(self, num_layers: int, device: torch.device, sync_plan: str, drawer: str) -> None:
        self._device = device
        self._hooks = BodyFirstForwardHooks()
        self._prefetcher = ResetPrefetcherByName(
            num_ssu_calls=num_layers, device=device, sync_plan=sync_plan, drawer=drawer
        )
        self._hooks.register(self._prefetcher)

    def forward_scope(self, captured: bool) -> AbstractContextManager[object]:
        return self._hooks.forward(ForwardInfo(runs_ssu=True, full_cudagraph=captured))

    def seed(self) -> torch.Tensor:
        return _prefetched_or_stock(self._prefetcher.next_seed, self._device)


class HookedSource:
    """A bench prefetcher (bench/outside_graph.py, bench/checked_once.py) behind the
    runner hooks, drawing with the seed kernel; without CUDA, stock's inline draw."""

    def __init__(self, num_layers: int, device: torch.device, make: Callable[..., object]) -> None:
        from runner_hooks.core.seed_kernel import SeedKernelUnavailable

        from .drawers import kernel_drawer

        self._device = device
        self._hooks = BodyFirstForwardHooks()
        self._prefetcher: object | None = None
        if cuda_device(device, num_layers) is None:
            return
        drawer = kernel_drawer()
        if isinstance(drawer, str):
            raise SeedKernelUnavailable(drawer)
        self._prefetcher = make(num_layers, device, drawer.draw)
        self._hooks.register(self._prefetcher)  # type: ignore[arg-type]

    def forward_scope(self, captured: bool) -> AbstractContextManager[object]:
        return self._hooks.forward(ForwardInfo(runs_ssu=True, full_cudagraph=captured))

    def seed(self) -> torch.Tensor:
        if self._prefetcher is None:
            return torch.randint(0, SEED_HIGH, (1,), device=self._device)
        return _prefetched_or_stock(self._prefetcher.next_seed, self._device)  # type: ignore[attr-defined]


class ReplayingGraph:
    """A captured graph whose every replay runs inside a forward of the hooks (the
    outside-graph variant's: its replay's seeds are drawn before the graph runs)."""

    def __init__(self, graph: torch.cuda.CUDAGraph, hooks: hooks.ForwardHooks) -> None:
        self._graph, self._hooks = graph, hooks

    def replay(self) -> None:
        with self._hooks.forward(ForwardInfo(runs_ssu=True, full_cudagraph=True)):
            self._graph.replay()


class OutsideGraphSource(HookedSource):
    def __init__(self, num_layers: int, device: torch.device) -> None:
        from .outside_graph import outside_graph_prefetcher

        super().__init__(num_layers, device, outside_graph_prefetcher)

    def around_replay(self, graph: torch.cuda.CUDAGraph) -> object:
        """What the bench replays in place of `graph`."""
        return graph if self._prefetcher is None else ReplayingGraph(graph, self._hooks)


class CheckedOnceSource(HookedSource):
    def __init__(self, num_layers: int, device: torch.device) -> None:
        from .checked_once import checked_once_prefetcher

        super().__init__(num_layers, device, checked_once_prefetcher)


@dataclass(frozen=True)
class VariantSpec:
    """A variant by name, and how to build its seed source for N layers on a device."""

    name: str
    build: Callable[[int, torch.device], SeedSource]
    seed_checked: bool = True
    """False for the two floors: their seeds are fixed by design."""


def variant_specs() -> list[VariantSpec]:
    """Every variant, in the order the tables list them: stock, forward-context,
    reset..., floors."""
    specs = [
        VariantSpec(STOCK, lambda layers, device: StockSource(device)),
        VariantSpec("forward-context", ContextIdentitySource),
    ]
    for plan in SYNC_PLANS:
        for drawer in DRAWERS:
            build = functools.partial(_reset, sync_plan=plan, drawer=drawer)
            specs.append(VariantSpec(f"reset-{plan}-{drawer}", build))
    specs.append(VariantSpec("reset-outside-graph", OutsideGraphSource))
    specs.append(VariantSpec("reset-checked-once", CheckedOnceSource))
    specs.append(
        VariantSpec(
            FLOOR_RNG, lambda layers, device: DrawingFloorSource(device), seed_checked=False
        )
    )
    specs.append(VariantSpec(FLOOR, lambda layers, device: FloorSource(device), seed_checked=False))
    return specs


def _reset(num_layers: int, device: torch.device, *, sync_plan: str, drawer: str) -> ResetSource:
    return ResetSource(num_layers, device, sync_plan, drawer)


def unavailable_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "this drawer cannot be built on this machine", not a bug.

    The one-kernel drawer raises SeedKernelUnavailable where it cannot compile
    or load; an ImportError covers a drawer module that is not there.
    """
    try:
        from runner_hooks.core.seed_kernel import SeedKernelUnavailable
    except ImportError:
        return (ImportError,)
    return (ImportError, SeedKernelUnavailable)


def run_step(
    model: DecodeModel,
    source: SeedSource,
    captured: bool = False,
    record: torch.Tensor | None = None,
) -> None:
    """One decode step of `model` with `source`'s seed path, as the model runner would run it."""
    with source.forward_scope(captured):
        model.forward(source.seed, record)
