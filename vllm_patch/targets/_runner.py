"""What the model-runner modules share: the import of sr_seed_forward, and reading a
`set_forward_context(...)` call for the placeholders of landing code."""

from __future__ import annotations

import ast
from collections.abc import Callable

from ..syntax import (
    AddImportedNames,
    Find,
    InsertStatements,
    Operation,
    SiteError,
    Source,
    contains_call,
    imports_from,
    is_call,
    keyword,
)
from .ssu_dispatch import PATH as SSU_DISPATCH_PATH

SSU_DISPATCH_MODULE = SSU_DISPATCH_PATH.removesuffix(".py").replace("/", ".")
FORWARD = "sr_seed_forward"
"""What the runners wrap each model forward in (ssu_dispatch.py)."""
REPLAY = "sr_seed_replay"
"""What the V2 runner calls before a FULL graph's replay (ssu_dispatch.py)."""


def forward_import(*, runner: bool, names: tuple[str, ...] = (FORWARD,)) -> Operation:
    """`names` added to a runner's ssu_dispatch import; the V2 graph manager, which
    has none, gets one of sr_seed_forward after vllm.logger's."""
    if runner:
        return AddImportedNames(
            why=f"import {', '.join(names)}",
            at=Find(
                "",
                f"`from {SSU_DISPATCH_MODULE} import ...`",
                imports_from(SSU_DISPATCH_MODULE),
                direct=True,
            ),
            names=names,
        )
    return InsertStatements(
        why=f"import {FORWARD}",
        at=Find("", "`from vllm.logger import ...`", imports_from("vllm.logger"), direct=True),
        code=f"from {SSU_DISPATCH_MODULE} import {FORWARD}\n",
    )


def forward_context_with(qualname: str, body_call: str) -> Find:
    """The `with` statement of `qualname` that opens `set_forward_context(...)` and
    runs `body_call` (the model) inside."""
    return Find(
        qualname,
        f"`with set_forward_context(...)` statement around `{body_call}(...)`",
        lambda n: (
            isinstance(n, ast.With)
            and any(is_call(item.context_expr, "set_forward_context") for item in n.items)
            and contains_call(n, body_call)
        ),
    )


def is_forward_context_item(item: ast.withitem) -> bool:
    return is_call(item.context_expr, "set_forward_context")


def forward_context_call(source: Source, at: Find) -> ast.Call:
    with_stmt = at.node(source)
    assert isinstance(with_stmt, ast.With)
    call = next(i.context_expr for i in with_stmt.items if is_forward_context_item(i))
    assert isinstance(call, ast.Call)
    if not call.args:
        raise SiteError(f"{at.qualname}: set_forward_context(...) is given no attention metadata")
    return call


def forward_context_names(
    at: Find, *, micro_batched: bool = True
) -> Callable[[Source], dict[str, str]]:
    """ATTN_METADATA, CUDAGRAPH_MODE and UBATCH_SLICES as the set_forward_context call
    of `at` is given them (the last two required with `micro_batched`)."""

    def names(source: Source) -> dict[str, str]:
        call = forward_context_call(source, at)
        found = {"ATTN_METADATA": source.segment(call.args[0])}
        mode = keyword(call, "cudagraph_runtime_mode")
        if mode is not None:
            found["CUDAGRAPH_MODE"] = source.segment(mode)
        ubatch = keyword(call, "ubatch_slices")
        if ubatch is not None:
            found["UBATCH_SLICES"] = source.segment(ubatch)
        if micro_batched and "UBATCH_SLICES" not in found:
            raise SiteError(f"{at.qualname}: set_forward_context(...) is given no ubatch_slices")
        if "CUDAGRAPH_MODE" not in found and micro_batched:
            raise SiteError(
                f"{at.qualname}: set_forward_context(...) is given no cudagraph_runtime_mode"
            )
        return found

    return names
