"""Per-forward hooks for model runners; Mamba stochastic-rounding seed prefetchers."""

try:
    import torch  # noqa: F401
except ModuleNotFoundError as error:
    if error.name != "torch":
        raise
    raise ImportError(
        "runner_hooks needs torch, which this Python cannot import: pip install torch "
        "(or install sr-seed-prefetch with its hooks extra: pip install -e '.[hooks]')"
    ) from None

from .designs import ForwardContextSeedPrefetcher, SRSeedPrefetcher
from .drawers import DRAWERS, RandintDrawer, SeedDrawer, resolve_drawer
from .hooks import (
    ForwardHook,
    ForwardHookHandle,
    ForwardHooks,
    ForwardInfo,
    NestedForwardError,
)
from .prefetch import IncompleteSeedBatchError, WrongStreamError
from .sync import SYNC_PLANS, SyncPlan, resolve_sync_plan

__all__ = [
    "DRAWERS",
    "SYNC_PLANS",
    "ForwardContextSeedPrefetcher",
    "ForwardHook",
    "ForwardHookHandle",
    "ForwardHooks",
    "ForwardInfo",
    "IncompleteSeedBatchError",
    "NestedForwardError",
    "RandintDrawer",
    "SRSeedPrefetcher",
    "SeedDrawer",
    "SyncPlan",
    "WrongStreamError",
    "resolve_drawer",
    "resolve_sync_plan",
]
