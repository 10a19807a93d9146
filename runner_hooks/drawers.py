"""How N stock-identical seeds are produced.

Stock vLLM calls `torch.randint(0, 2**32, (1,), device=...)` once per SSU
call.  A drawer writes the values that a run of such calls would return, in
order, advancing the device's default CUDA generator exactly as they would,
so the generator is left where stock leaves it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Protocol

import torch

logger = logging.getLogger(__name__)

SEED_HIGH = 2**32
"""Stock's exclusive upper bound: `torch.randint(0, 2**32, (1,))`."""


def stock_seed(device: torch.device) -> torch.Tensor:
    """One seed exactly as stock draws it, inline on the current stream."""
    return torch.randint(0, SEED_HIGH, (1,), device=device)


class SeedDrawer(Protocol):
    """Produces stock-identical seeds into a buffer."""

    name: str

    def draw(self, out: torch.Tensor) -> None:
        """Fills the 1-D contiguous int64 CUDA tensor `out`, on the current stream.

        out[k] is the value the k-th of len(out) consecutive stock draws on
        out's device would return from the generator's present state.
        """
        ...


class RandintDrawer:
    """One stock draw per seed: the same kernel, shape, dtype and order as stock.

    `random_(0, 2**32)` on a one-element int64 view is what `torch.randint`
    runs on the tensor it allocates, so each value and each generator
    advance is stock's.
    """

    name = "randint"

    def draw(self, out: torch.Tensor) -> None:
        for seed in out.split(1):
            seed.random_(0, SEED_HIGH)


def _kernel_drawer() -> SeedDrawer:
    from .seed_kernel import KernelDrawer

    return KernelDrawer()


DRAWERS: dict[str, Callable[[], SeedDrawer]] = {
    RandintDrawer.name: RandintDrawer,
    "kernel": _kernel_drawer,
}
"""The drawers users can force by name; "auto" picks among them."""


@functools.cache
def _auto_drawer() -> SeedDrawer | None:
    """The one-kernel drawer where it builds; else None: no prefetching at all.

    Never slower than stock: with the randint drawer no sync plan is as fast
    as stock in both eager and graph mode at every batch size
    (bench/results/nvidia-h200-20261130.summary.json, BS 1-8, ratio to stock:
    current_stream 1.014x under graphs at BS 1 and 2; single 1.017x and
    1.009x eagerly at BS 1 and 4; geometric 1.04-1.05x and per_seed
    1.16-1.23x eagerly), and mixed prefill/decode batches run the Mamba op
    eagerly even under PIECEWISE graphs.  So where the kernel cannot be built,
    "auto" leaves the stock per-call draw in place and says why, once; a user
    who wants randint anyway names it.  Cached: the choice and its log line
    are made once per process.
    """
    from .seed_kernel import SeedKernelUnavailable

    try:
        drawer = _kernel_drawer()
    except SeedKernelUnavailable as reason:
        logger.warning(
            "Not prefetching stochastic-rounding seeds: the one-kernel drawer is "
            "unavailable (%s), and drawing them with one randint per seed is not as "
            "fast as stock in both eager and CUDA-graph forwards. Name the randint "
            "drawer to prefetch with it anyway.",
            reason,
        )
        return None
    logger.info("Drawing stochastic-rounding seeds with one kernel per forward")
    return drawer


def drawer_factory(drawer: str | SeedDrawer) -> Callable[[], SeedDrawer | None]:
    """How to make the drawer given or named ("auto", or a key of DRAWERS).

    Names are checked now; building (the one-kernel drawer compiles) waits
    until the factory is called, so a disabled prefetcher builds nothing.
    Only "auto" may make None: no drawer is faster than stock here.
    """
    if not isinstance(drawer, str):
        return lambda: drawer
    if drawer == "auto":
        return _auto_drawer
    try:
        return DRAWERS[drawer]
    except KeyError:
        raise ValueError(
            f"unknown seed drawer {drawer!r}; choose 'auto' or one of {sorted(DRAWERS)}"
        ) from None


def resolve_drawer(drawer: str | SeedDrawer) -> SeedDrawer | None:
    """The drawer itself, or the one named, built (None: "auto" found none)."""
    return drawer_factory(drawer)()
