"""vllm/v1/worker/gpu/cudagraph_utils.py (the V2 graph manager), reset design only.

`ModelCudaGraphManager.capture` takes the runner's hooks, and `forward_fn`
runs inside them: warm-up, PIECEWISE capture, and FULL capture, which the base
loop runs with cg_mode NONE inside torch.cuda.graph.  The DBO capture
(`ubatch_forward_fn`, from 0.30.0) stays outside: a micro-batched forward's
seeds are drawn inline, as outside any forward.  Speculators capture through
the base CudaGraphManager and run their forwards outside these sites, so
drafters never fire the hooks.
"""

from __future__ import annotations

import ast

from ..releases import Release, Site
from ..syntax import (
    AddArgument,
    AddWithItem,
    FileOperations,
    Find,
    landing,
)
from ._runner import (
    forward_context_names,
    forward_context_with,
    hook_imports,
    is_forward_context_item,
)

PATH = "vllm/v1/worker/gpu/cudagraph_utils.py"

_CAPTURE = "ModelCudaGraphManager.capture"
_FORWARD_FN = forward_context_with(f"{_CAPTURE}.create_forward_fn.forward_fn", "model")


def operations(release: Release) -> FileOperations:
    del release  # every supported release has these sites
    return FileOperations(
        PATH,
        (
            *hook_imports(relay=False),
            AddArgument(
                why="ModelCudaGraphManager.capture takes the runner's forward hooks",
                site=Site.V2_CAPTURE,
                at=Find(
                    "ModelCudaGraphManager",
                    "def capture",
                    lambda n: isinstance(n, ast.FunctionDef) and n.name == "capture",
                    direct=True,
                ),
                code="forward_hooks: sr_seed_prefetch.ForwardHooks",
                keyword_only=True,
            ),
            AddWithItem(
                why="warm-up, PIECEWISE and FULL capture forwards run inside the hooks",
                site=Site.V2_CAPTURE,
                at=_FORWARD_FN,
                after_item=is_forward_context_item,
                code=landing("v2_capture_item.py"),
                names=forward_context_names(_FORWARD_FN, micro_batched=False),
            ),
        ),
    )
