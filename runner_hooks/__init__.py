"""Mamba stochastic-rounding seed prefetchers: what lands in vLLM.

`core` is the reset design's unit and `forward_context` the forward-context
design's: each design's patch vendors its unit's import closure
(vllm_patch/vendor.py).  `hooks` holds per-forward hooks that the bench's
simulated runners call (bench/variants.py); vLLM's runners call the landed
`sr_seed_forward` instead.  The bench's choices (drawers by name, sync plans,
the variants built from them) are bench's: bench/drawers.py, bench/sync.py,
bench/variants.py.
"""

try:
    import torch  # noqa: F401
    import triton  # noqa: F401
except ModuleNotFoundError as error:
    if error.name not in ("torch", "triton"):
        raise
    raise ImportError(
        f"runner_hooks needs {error.name}, which this Python cannot import: "
        f"pip install {error.name} (or install sr-seed-prefetch with its hooks extra: "
        "pip install -e '.[hooks]')"
    ) from None

from .core import SeedPrefetch, SRSeedPrefetcher
from .forward_context import ForwardContextSeedPrefetcher
from .forward_context.side_stream import SyncPlan, UnjoinedCaptureError

__all__ = [
    "ForwardContextSeedPrefetcher",
    "SRSeedPrefetcher",
    "SeedPrefetch",
    "SyncPlan",
    "UnjoinedCaptureError",
]
