"""Per-forward hooks for model runners; Mamba stochastic-rounding seed prefetchers.

`core` is the reset design's unit and `baseline` the forward-context design's:
each is what its vLLM patch vendors.  The names here add the bench's choices.
"""

try:
    import torch  # noqa: F401
except ModuleNotFoundError as error:
    if error.name != "torch":
        raise
    raise ImportError(
        "runner_hooks needs torch, which this Python cannot import: pip install torch "
        "(or install sr-seed-prefetch with its hooks extra: pip install -e '.[hooks]')"
    ) from None

from .baseline.side_stream import SyncPlan, UnjoinedCaptureError
from .core.prefetch import WrongStreamError
from .drawers import DRAWERS, RandintDrawer, SeedDrawer, resolve_drawer
from .hooks import ForwardHook, ForwardInfo, NestedForwardError
from .sync import SYNC_PLANS, resolve_sync_plan
from .variants import ForwardContextSeedPrefetcher, ForwardHooks, SRSeedPrefetcher

__all__ = [
    "DRAWERS",
    "SYNC_PLANS",
    "ForwardContextSeedPrefetcher",
    "ForwardHook",
    "ForwardHooks",
    "ForwardInfo",
    "NestedForwardError",
    "RandintDrawer",
    "SRSeedPrefetcher",
    "SeedDrawer",
    "SyncPlan",
    "UnjoinedCaptureError",
    "WrongStreamError",
    "resolve_drawer",
    "resolve_sync_plan",
]
