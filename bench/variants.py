"""Where each layer's rand_seed comes from: the variants the bench compares.

* stock: `torch.randint(0, 2**32, (1,))` inline before each SSU, as vLLM
  0.33.0's FlashInferSSUBackend does.
* forward-context: the forward-context design, `ForwardContextSeedPrefetcher`, with
  its defaults (one event per seed, randint drawer); a forward is told apart
  by the identity of a fresh object per step, standing in for vLLM's
  ForwardContext.
* reset-<plan>-<drawer>: the reset design, `SRSeedPrefetcher` behind `ForwardHooks`,
  for every sync plan in `runner_hooks.sync.SYNC_PLANS` and every drawer in
  `runner_hooks.drawers.DRAWERS` found at run time, so new ones join the
  bench without edits here.
* floor-rng: the floor plus one one-element draw from the default generator
  per forward, the drawing floor (summary.FLOOR_RNG says what it costs);
* floor: one fixed seed tensor, nothing drawn; the no-RNG-cost reference.

The two floors' seeds are fixed by design, so they are exempt from the seed check.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch

from runner_hooks import (
    ForwardContextSeedPrefetcher,
    ForwardHooks,
    ForwardInfo,
    SRSeedPrefetcher,
)
from runner_hooks.drawers import DRAWERS, SEED_HIGH
from runner_hooks.sync import SYNC_PLANS

from .summary import FLOOR, FLOOR_RNG, STOCK
from .synthetic_model import DecodeModel


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
    """The seed document's design: forwards told apart by the current forward object's identity."""

    def __init__(self, num_layers: int, device: torch.device) -> None:
        self._device = device
        self._current: _Forward | None = None
        self._prefetcher = ForwardContextSeedPrefetcher(
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
    """Ours: the runner's ForwardHooks tell the prefetcher where each forward begins and ends."""

    def __init__(self, num_layers: int, device: torch.device, sync_plan: str, drawer: str) -> None:
        self._device = device
        self._hooks = ForwardHooks()
        self._prefetcher = SRSeedPrefetcher(
            num_ssu_calls=num_layers, device=device, sync_plan=sync_plan, drawer=drawer
        )
        self._hooks.register(self._prefetcher)

    def forward_scope(self, captured: bool) -> AbstractContextManager[object]:
        return self._hooks.forward(ForwardInfo(runs_ssu=True, full_cudagraph=captured))

    def seed(self) -> torch.Tensor:
        return _prefetched_or_stock(self._prefetcher.next_seed, self._device)


@dataclass(frozen=True)
class VariantSpec:
    """A variant by name, and how to build its seed source for N layers on a device."""

    name: str
    build: Callable[[int, torch.device], SeedSource]
    seed_checked: bool = True
    """False for the two floors: their seeds are fixed by design."""


def variant_specs() -> list[VariantSpec]:
    """Every variant, in the order the tables list them: stock, forward-context, reset..., floors."""
    specs = [
        VariantSpec(STOCK, lambda layers, device: StockSource(device)),
        VariantSpec("forward-context", ContextIdentitySource),
    ]
    for plan in SYNC_PLANS:
        for drawer in DRAWERS:
            build = functools.partial(_reset, sync_plan=plan, drawer=drawer)
            specs.append(VariantSpec(f"reset-{plan}-{drawer}", build))
    specs.append(
        VariantSpec(
            FLOOR_RNG, lambda layers, device: DrawingFloorSource(device), seed_checked=False
        )
    )
    specs.append(VariantSpec(FLOOR, lambda layers, device: FloorSource(device), seed_checked=False))
    return specs


def _reset(
    num_layers: int, device: torch.device, *, sync_plan: str, drawer: str
) -> ResetSource:
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
