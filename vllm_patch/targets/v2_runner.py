"""vllm/v1/worker/gpu/model_runner.py (the V2 runner), reset design only.

execute_model runs a forward in one of two branches: a FULL graph replay
(`run_fullgraph`: no Python forward, so sr_seed_replay draws the graph's seeds
before it) or the model under `set_forward_context` (PIECEWISE, eager, DBO),
which sr_seed_forward joins, as in V1.  _dummy_run (profile, warm-up, DP
dummy) goes through execute_model; the captures go through the graph manager
(v2_cudagraph.py).
"""

from __future__ import annotations

import ast

from ..releases import Release, Site
from ..syntax import (
    AddWithItem,
    FileOperations,
    Find,
    InsertStatements,
    SiteError,
    Source,
    find_scope,
    is_call,
    landing,
)
from ._runner import (
    FORWARD,
    REPLAY,
    forward_context_names,
    forward_context_with,
    forward_import,
    is_forward_context_item,
)

PATH = "vllm/v1/worker/gpu/model_runner.py"

_EXECUTE = "GPUModelRunner.execute_model"
_MODEL_WITH = forward_context_with(_EXECUTE, "self.model")
_REPLAY_CALL = "self.cudagraph_manager.run_fullgraph"
_REPLAY = Find(
    _EXECUTE,
    f"statement calling `{_REPLAY_CALL}(...)`",
    lambda n: (
        isinstance(n, ast.stmt)
        and not isinstance(n, ast.If | ast.With | ast.For | ast.While | ast.Try)
        and any(is_call(c, _REPLAY_CALL) for c in ast.walk(n))
    ),
)


def _names(source: Source) -> dict[str, str]:
    """ATTN_METADATA off the set_forward_context call, and MICRO_BATCHED: whether
    execute_model runs DBO micro-batches (`ubatch_state`, 0.30.0 on)."""
    execute = find_scope(source, _EXECUTE)
    dbo = any(isinstance(n, ast.Name) and n.id == "ubatch_state" for n in ast.walk(execute))
    names = forward_context_names(_MODEL_WITH, micro_batched=False)(source)
    names["MICRO_BATCHED"] = "ubatch_state is not None" if dbo else "False"
    return names


def _replayed_graph(source: Source) -> dict[str, str]:
    """GRAPH: the descriptor the FULL replay is given."""
    call = next(c for c in ast.walk(_REPLAY.node(source)) if is_call(c, _REPLAY_CALL))
    assert isinstance(call, ast.Call)
    if len(call.args) != 1 or call.keywords:
        raise SiteError(f"{_EXECUTE}: `{_REPLAY_CALL}` is not given one descriptor")
    return {"GRAPH": source.segment(call.args[0])}


def operations(release: Release) -> FileOperations:
    del release  # every supported release has this site
    return FileOperations(
        PATH,
        (
            forward_import(runner=True, names=(FORWARD, REPLAY)),
            InsertStatements(
                why="execute_model: a FULL graph's seeds are drawn before its replay",
                site=Site.V2_REPLAY,
                at=_REPLAY,
                after=False,
                code=landing("v2_replay_item.py"),
                names=_replayed_graph,
            ),
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
