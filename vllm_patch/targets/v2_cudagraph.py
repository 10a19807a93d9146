"""vllm/v1/worker/gpu/cudagraph_utils.py (the V2 graph manager), reset design only.

`ModelCudaGraphManager.capture` takes the runner's hooks, and every forward
it runs does so inside them: `forward_fn` (warm-up, PIECEWISE capture, and
FULL capture, which the base loop runs with cg_mode NONE inside
torch.cuda.graph) and, from 0.30.0, `ubatch_forward_fn` (DBO FULL capture).
Speculators capture through the base CudaGraphManager and run their forwards
outside these sites, so drafters never fire the hooks.
"""

from __future__ import annotations

import ast

from ..releases import Release, Site
from ..syntax import (
    AddArgument,
    AddWithItem,
    FileOperations,
    Find,
    Operation,
    Source,
    WrapInWith,
    contains_call,
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
UBATCH_FORWARD_FN = "ubatch_forward_fn"


def has_ubatch_capture(source: Source) -> bool:
    """Whether the file defines the DBO capture's `ubatch_forward_fn` (0.30.0 on)."""
    return any(
        isinstance(node, ast.FunctionDef) and node.name == UBATCH_FORWARD_FN
        for node in ast.walk(source.tree)
    )


def operations(release: Release) -> FileOperations:
    dbo: list[Operation] = []
    if release.has(Site.V2_UBATCH_CAPTURE):
        dbo.append(
            WrapInWith(
                why="DBO capture: the micro-batched forward runs inside the hooks",
                site=Site.V2_UBATCH_CAPTURE,
                at=Find(
                    f"{_CAPTURE}.create_forward_fn.{UBATCH_FORWARD_FN}",
                    "statement that runs the micro-batched forward (`finish()`)",
                    lambda n: isinstance(n, ast.Expr) and contains_call(n, "finish"),
                ),
                code=landing("v2_ubatch_capture_item.py"),
            )
        )
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
                code="forward_hooks: ForwardHooks",
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
            *dbo,
        ),
    )
