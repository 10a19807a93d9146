"""Mamba stochastic-rounding seed prefetchers: what lands in vLLM.

`core` is the reset design's unit and `baseline` the forward-context design's: each is
what its vLLM patch vendors.  `hooks` holds the per-forward hooks the model runners
call.  The bench's choices (drawers by name, sync plans, the variants built from them)
are bench's: bench/drawers.py, bench/sync.py, bench/variants.py.
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

from .baseline import ForwardContextSeedPrefetcher
from .baseline.side_stream import SyncPlan, UnjoinedCaptureError
from .core import SeedPrefetch, SRSeedPrefetcher
from .core.prefetch import WrongStreamError

__all__ = [
    "ForwardContextSeedPrefetcher",
    "SRSeedPrefetcher",
    "SeedPrefetch",
    "SyncPlan",
    "UnjoinedCaptureError",
    "WrongStreamError",
]
