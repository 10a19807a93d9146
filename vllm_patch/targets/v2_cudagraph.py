"""vllm/v1/worker/gpu/cudagraph_utils.py (the V2 graph manager), reset design only.

`forward_fn` of `ModelCudaGraphManager.capture` runs inside sr_seed_forward:
warm-up, PIECEWISE capture, and FULL capture, which the base loop runs with
cg_mode NONE inside torch.cuda.graph.  The DBO capture
(`ubatch_forward_fn`, from 0.30.0) stays outside: a micro-batched forward's
seeds are drawn inline, as outside any forward.  Speculators capture through
the base CudaGraphManager and run their forwards outside these sites, so
drafters never take prefetched seeds.
"""

from __future__ import annotations

from ..releases import Release, Site
from ..syntax import (
    AddWithItem,
    FileOperations,
    landing,
)
from ._runner import (
    forward_context_names,
    forward_context_with,
    forward_import,
    is_forward_context_item,
)

PATH = "vllm/v1/worker/gpu/cudagraph_utils.py"

_CAPTURE = "ModelCudaGraphManager.capture"
_FORWARD_FN = forward_context_with(f"{_CAPTURE}.create_forward_fn.forward_fn", "model")


def operations(release: Release) -> FileOperations:
    del release  # every supported release has this site
    return FileOperations(
        PATH,
        (
            forward_import(runner=False),
            AddWithItem(
                why="warm-up, PIECEWISE and FULL capture forwards run inside sr_seed_forward",
                site=Site.V2_CAPTURE,
                at=_FORWARD_FN,
                after_item=is_forward_context_item,
                code=landing("v2_capture_item.py"),
                names=forward_context_names(_FORWARD_FN, micro_batched=False),
            ),
        ),
    )
