"""How N stock-identical seeds are produced: the drawers users and the bench name.

Stock vLLM calls `torch.randint(0, 2**32, (1,), device=...)` once per SSU
call.  A drawer writes the values that a run of such calls would return, in
order, advancing the device's default CUDA generator exactly as they would.
The reset design in vLLM carries only the Triton drawer, which draws outside
every graph: with randint, every sync plan is slower than stock at some batch
size, eagerly or under graphs (bench/results/sync-plan-defaults.md).  The randint
drawer is the forward-context design's, and the bench's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from runner_hooks.forward_context.prefetcher import RandintDrawer


class SeedDrawer(Protocol):
    """Fills `out` with len(out) stock draws' values, on the current stream;
    `name` names it in the bench's variants."""

    name: str

    def draw(self, out: torch.Tensor) -> None: ...


SEED_HIGH = 2**32
"""Stock's exclusive upper bound: `torch.randint(0, 2**32, (1,))`."""


def stock_seed(device: torch.device) -> torch.Tensor:
    """One seed exactly as stock draws it, inline on the current stream."""
    return torch.randint(0, SEED_HIGH, (1,), device=device)


class TritonDrawer:
    """All of a forward's seeds from one Triton launch outside any graph
    (runner_hooks/core/randint_seeds.py); values and advance are stock's."""

    name = "triton"

    def __init__(self) -> None:
        from runner_hooks.core.randint_seeds import fill_randint_seeds

        self.draw = fill_randint_seeds


DRAWERS: dict[str, Callable[[], SeedDrawer]] = {
    RandintDrawer.name: RandintDrawer,
    TritonDrawer.name: TritonDrawer,
}
"""The drawers users can force by name; "auto" is the Triton drawer."""


def drawer_factory(drawer: str | SeedDrawer) -> Callable[[], SeedDrawer | str]:
    """How to make the drawer given or named ("auto", or a key of DRAWERS).

    Names are checked now; building waits until the factory is called, so an
    inactive prefetcher builds nothing.
    """
    if not isinstance(drawer, str):
        return lambda: drawer
    if drawer == "auto":
        return TritonDrawer
    try:
        return DRAWERS[drawer]
    except KeyError:
        raise ValueError(
            f"unknown seed drawer {drawer!r}; choose 'auto' or one of {sorted(DRAWERS)}"
        ) from None


def resolve_drawer(drawer: str | SeedDrawer) -> SeedDrawer | None:
    """The drawer itself, or the one named, built (None: "auto" found none)."""
    made = drawer_factory(drawer)()
    return None if isinstance(made, str) else made
