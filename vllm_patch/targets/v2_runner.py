"""vllm/v1/worker/gpu/model_runner.py (the V2 runner), reset design only.

execute_model runs a forward in one of two branches: a FULL graph replay
(`run_fullgraph`, no Python forward) or the model under `set_forward_context`
(PIECEWISE, eager, DBO).  `forward_info` is built once before the branch; the
replay statement is wrapped in the hooks (the one statement re-indented), and
the hooks join the other branch's `with`.  _dummy_run (profile, warm-up, DP
dummy) goes through execute_model.  capture_model hands the hooks to the graph
manager's capture (v2_cudagraph.py).
"""

from __future__ import annotations

import ast

from ..releases import Release, Site
from ..syntax import (
    AddArgument,
    AddWithItem,
    FileOperations,
    Find,
    InsertStatements,
    Source,
    WrapInWith,
    contains_call,
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
_RUN_FULLGRAPH = "self.cudagraph_manager.run_fullgraph"
_MODEL_WITH = forward_context_with(_EXECUTE, "self.model")


def _forward_info(source: Source) -> str:
    """The forward_info statement for this runner: one that reads the attention metadata
    per micro-batch where execute_model runs DBO micro-batches (0.30.0 on)."""
    execute = find_scope(source, _EXECUTE)
    dbo = any(isinstance(n, ast.Name) and n.id == "ubatch_state" for n in ast.walk(execute))
    return landing("v2_forward_info_dbo.py" if dbo else "v2_forward_info.py")


def operations(release: Release) -> FileOperations:
    del release  # every supported release has these sites
    return FileOperations(
        PATH,
        (
            *hook_imports(relay=True),
            hooks_in_init("GPUModelRunner"),
            InsertStatements(
                why="execute_model: what the hooks are told of the forward, either branch",
                site=Site.V2_EXECUTE_MODEL,
                at=Find(
                    _EXECUTE,
                    f"`if` that replays a FULL graph (`{_RUN_FULLGRAPH}`) or runs the model",
                    lambda n: (
                        isinstance(n, ast.If)
                        and any(contains_call(s, _RUN_FULLGRAPH) for s in n.body)
                        and any(contains_call(s, "set_forward_context") for s in n.orelse)
                    ),
                ),
                code=_forward_info,
                after=False,
                names=forward_context_names(_MODEL_WITH, micro_batched=False),
            ),
            WrapInWith(
                why="execute_model: a FULL graph replay runs inside the hooks",
                site=Site.V2_EXECUTE_MODEL,
                at=Find(
                    _EXECUTE,
                    f"statement calling `{_RUN_FULLGRAPH}`",
                    lambda n: isinstance(n, ast.Assign) and is_call(n.value, _RUN_FULLGRAPH),
                ),
                code="self.forward_hooks.forward(forward_info)",
            ),
            AddWithItem(
                why="execute_model: PIECEWISE, eager and DBO forwards run inside the hooks",
                site=Site.V2_EXECUTE_MODEL,
                at=_MODEL_WITH,
                after_item=is_forward_context_item,
                code="self.forward_hooks.forward(forward_info)",
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
