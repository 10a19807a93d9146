"""vllm/v1/worker/gpu/model_runner.py (the V2 runner), reset design only.

execute_model runs a forward in one of two branches: a FULL graph replay
(`run_fullgraph`: no Python forward; the prefetcher's draws were captured into
the graph) or the model under `set_forward_context` (PIECEWISE, eager, DBO),
which sr_seed_forward joins, as in V1.  _dummy_run (profile, warm-up, DP
dummy) goes through execute_model; the captures go through the graph manager
(v2_cudagraph.py).
"""

from __future__ import annotations

import ast

from ..releases import Release, Site
from ..syntax import AddWithItem, FileOperations, Source, find_scope, landing
from ._runner import (
    forward_context_names,
    forward_context_with,
    forward_import,
    is_forward_context_item,
)

PATH = "vllm/v1/worker/gpu/model_runner.py"

_EXECUTE = "GPUModelRunner.execute_model"
_MODEL_WITH = forward_context_with(_EXECUTE, "self.model")


def _names(source: Source) -> dict[str, str]:
    """ATTN_METADATA off the set_forward_context call, and MICRO_BATCHED: whether
    execute_model runs DBO micro-batches (`ubatch_state`, 0.30.0 on)."""
    execute = find_scope(source, _EXECUTE)
    dbo = any(isinstance(n, ast.Name) and n.id == "ubatch_state" for n in ast.walk(execute))
    names = forward_context_names(_MODEL_WITH, micro_batched=False)(source)
    names["MICRO_BATCHED"] = "ubatch_state is not None" if dbo else "False"
    return names


def operations(release: Release) -> FileOperations:
    del release  # every supported release has this site
    return FileOperations(
        PATH,
        (
            forward_import(runner=True),
            AddWithItem(
                why="execute_model: PIECEWISE, eager and DBO forwards run inside sr_seed_forward",
                site=Site.V2_EXECUTE_MODEL,
                at=_MODEL_WITH,
                after_item=is_forward_context_item,
                code=landing("v2_forward_item.py"),
                names=_names,
            ),
        ),
    )
