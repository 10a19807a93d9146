"""vllm/v1/worker/gpu/model_runner.py (the V2 runner), reset design only.

execute_model runs a forward in one of two branches: a FULL graph replay
(`run_fullgraph`: no Python forward, so nothing for the hooks to do; the
prefetcher's draws were captured into the graph) or the model under
`set_forward_context` (PIECEWISE, eager, DBO), which the hooks join, as in V1.
_dummy_run (profile, warm-up, DP dummy) goes through execute_model.
capture_model hands the hooks to the graph manager's capture (v2_cudagraph.py).
"""

from __future__ import annotations

import ast

from ..releases import Release, Site
from ..syntax import (
    AddArgument,
    AddWithItem,
    FileOperations,
    Find,
    Source,
    find_scope,
    is_call,
    landing,
)
from ._runner import (
    forward_context_names,
    forward_context_with,
    hook_imports,
    hooks_in_init,
    is_forward_context_item,
)

PATH = "vllm/v1/worker/gpu/model_runner.py"

_EXECUTE = "GPUModelRunner.execute_model"
_MODEL_WITH = forward_context_with(_EXECUTE, "self.model")


def _forward_item(source: Source) -> str:
    """The hooks' item for this runner's `with`: one that reads the attention metadata
    per micro-batch where execute_model runs DBO micro-batches (0.30.0 on)."""
    execute = find_scope(source, _EXECUTE)
    dbo = any(isinstance(n, ast.Name) and n.id == "ubatch_state" for n in ast.walk(execute))
    return landing("v2_forward_item_dbo.py" if dbo else "v2_forward_item.py")


def operations(release: Release) -> FileOperations:
    del release  # every supported release has these sites
    return FileOperations(
        PATH,
        (
            *hook_imports(relay=True),
            hooks_in_init("GPUModelRunner"),
            AddWithItem(
                why="execute_model: PIECEWISE, eager and DBO forwards run inside the hooks",
                site=Site.V2_EXECUTE_MODEL,
                at=_MODEL_WITH,
                after_item=is_forward_context_item,
                code=_forward_item,
                names=forward_context_names(_MODEL_WITH, micro_batched=False),
            ),
            AddArgument(
                why="capture_model hands the hooks to the graph manager's capture",
                site=Site.V2_CAPTURE,
                at=Find(
                    "GPUModelRunner.capture_model",
                    "call of `self.cudagraph_manager.capture`",
                    lambda n: is_call(n, "self.cudagraph_manager.capture"),
                    expression=True,
                ),
                code="forward_hooks=self.forward_hooks",
            ),
        ),
    )
