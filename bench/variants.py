"""The bench's variants: each design with every drawer and sync plan by name, and where
each layer's rand_seed comes from in the microbenchmark.

`runner_hooks.core` (the reset design) and `runner_hooks.forward_context` (the
forward-context design) are what lands in vLLM, with one drawer (and, for the
forward-context design, one sync plan) each; the classes here extend them with choices
by name, which vLLM's copies do not carry: ResetPrefetcherByName and
ForwardContextPrefetcherByName.  The microbenchmark's variants:

* stock: `torch.randint(0, 2**32, (1,))` inline before each SSU, as vLLM
  0.33.0's FlashInferSSUBackend does.
* forward-context: the forward-context design, `ForwardContextPrefetcherByName`, with
  its defaults (one event per seed, randint drawer); a forward is told apart
  by the identity of a fresh object per step, standing in for vLLM's
  ForwardContext.
* reset-<drawer>: the reset design, `ResetPrefetcherByName` behind `hooks.ForwardHooks`,
  for every drawer in `bench.drawers.DRAWERS` found at run time, so new ones join the
  bench without edits here: each forward's seeds drawn on its stream as its hook fires,
  a replay's too (`around_replay`), into one buffer every graph reads; no graph draws.
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
)
from runner_hooks.hooks import ForwardInfo

from .drawers import DRAWERS, SEED_HIGH, SeedDrawer, drawer_factory
from .summary import FLOOR, FLOOR_RNG, STOCK
from .sync import resolve_sync_plan
from .synthetic_model import DecodeModel

logger = logging.getLogger(__name__)


def _side_stream_prefetch(
    owner: object,
    num_ssu_calls: int,
    device: torch.device,
    plan: SyncPlan,
    make_drawer: Callable[[], SeedDrawer | str],
) -> SeedPrefetch | str:
    """The forward-context design's machinery for `plan`, or why none."""
    drawer = make_drawer()
    if isinstance(drawer, str):
        return drawer
    return SideStreamSeedPrefetch(type(owner).__name__, num_ssu_calls, device, drawer.draw, plan)


def _reset_prefetch(
    owner: object,
    num_ssu_calls: int,
    device: torch.device,
    make_drawer: Callable[[], SeedDrawer | str],
) -> SeedPrefetch | str:
    """The reset design's machinery with the drawer made, or why none."""
    drawer = make_drawer()
    if isinstance(drawer, str):
        return drawer
    return SeedPrefetch(type(owner).__name__, num_ssu_calls, device, drawer.draw)


class _ByName:
    """Builds the machinery from the drawer and plan a variant was given."""

    _make_drawer: Callable[[], SeedDrawer | str]
    _sync_plan: SyncPlan

    def _seed_prefetch(self, num_ssu_calls: int, device: torch.device) -> SeedPrefetch | str:
        return _side_stream_prefetch(
            self, num_ssu_calls, device, self._sync_plan, self._make_drawer
        )


class ResetPrefetcherByName(reset.SRSeedPrefetcher):
    """The reset design's prefetcher with a drawer by name.

    drawer: "auto" (the Triton drawer), a key of `bench.drawers.DRAWERS`, or a
    drawer. Inactive (`inactive_reason` says why) without CUDA
    or a drawer.
    """

    def __init__(
        self,
        num_ssu_calls: int,
        device: torch.device | str,
        *,
        drawer: str | SeedDrawer = "auto",
    ) -> None:
        make_drawer = drawer_factory(drawer)
        cuda = cuda_device(device, num_ssu_calls)
        made = NO_CUDA if cuda is None else _reset_prefetch(self, num_ssu_calls, cuda, make_drawer)
        self.inactive_reason = made if isinstance(made, str) else None
        # Inactive: no prefetch, and every forward takes no seeds (see _begin).
        super().__init__(None if isinstance(made, str) else made)  # type: ignore[arg-type]

    def _begin(self) -> None:
        if self.prefetch is None:
            self._batch = None
        else:
            super()._begin()

    def on_forward_begin(self, info: hooks.ForwardInfo) -> None:
        """As a hook of ForwardHooks: `forward()` for each forward that runs the
        SSU and is not micro-batched."""
        if info.runs_ssu and not info.micro_batched:
            self._begin()
        else:
            self._batch = None

    def on_forward_end(self, info: hooks.ForwardInfo) -> None:
        """Ends the forward, also one whose body raised (ForwardHooks logs
        what ending it raises then)."""
        self._end(info.full_cudagraph)


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
    begins and ends, and each replay of a captured step runs inside a forward."""

    def __init__(self, num_layers: int, device: torch.device, drawer: str) -> None:
        self._device = device
        self._hooks = hooks.ForwardHooks()
        self._prefetcher = ResetPrefetcherByName(
            num_ssu_calls=num_layers, device=device, drawer=drawer
        )
        self._hooks.register(self._prefetcher)

    def forward_scope(self, captured: bool) -> AbstractContextManager[object]:
        return self._hooks.forward(ForwardInfo(runs_ssu=True, full_cudagraph=captured))

    def seed(self) -> torch.Tensor:
        return _prefetched_or_stock(self._prefetcher.next_seed, self._device)

    def around_replay(self, graph: torch.cuda.CUDAGraph) -> object:
        """What the bench replays in place of `graph`."""
        return ReplayingGraph(graph, self._hooks)


class ReplayingGraph:
    """A captured graph whose every replay runs inside a FULL forward of the hooks,
    as vLLM's V1 runner replays one: the replay's seeds are drawn before the graph."""

    def __init__(self, graph: torch.cuda.CUDAGraph, hooks: hooks.ForwardHooks) -> None:
        self._graph, self._hooks = graph, hooks

    def replay(self) -> None:
        with self._hooks.forward(ForwardInfo(runs_ssu=True, full_cudagraph=True)):
            self._graph.replay()


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
    for drawer in DRAWERS:
        build = functools.partial(_reset, drawer=drawer)
        specs.append(VariantSpec(f"reset-{drawer}", build))
    specs.append(
        VariantSpec(
            FLOOR_RNG, lambda layers, device: DrawingFloorSource(device), seed_checked=False
        )
    )
    specs.append(VariantSpec(FLOOR, lambda layers, device: FloorSource(device), seed_checked=False))
    return specs


def _reset(num_layers: int, device: torch.device, *, drawer: str) -> ResetSource:
    return ResetSource(num_layers, device, drawer)


def unavailable_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "this drawer cannot be built on this machine", not a bug:
    an ImportError of a drawer's module."""
    return (ImportError,)


def run_step(
    model: DecodeModel,
    source: SeedSource,
    captured: bool = False,
    record: torch.Tensor | None = None,
) -> None:
    """One decode step of `model` with `source`'s seed path, as the model runner would run it."""
    with source.forward_scope(captured):
        model.forward(source.seed, record)
