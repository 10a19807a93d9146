"""What the model-runner modules share: the hook imports, the hooks an __init__ creates,
and reading a `set_forward_context(...)` call for the placeholders of landing code."""

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
    landing,
)
from .ssu_dispatch import PATH as SSU_DISPATCH_PATH
from .ssu_dispatch import VENDORED_MODULE

SSU_DISPATCH_MODULE = SSU_DISPATCH_PATH.removesuffix(".py").replace("/", ".")
_PACKAGE, _, _NAME = VENDORED_MODULE.rpartition(".")
HOOKS_IMPORT = f"from {_PACKAGE} import {_NAME}\n"
"""The runners name the hook contract through its package (`sr_seed_prefetch.ForwardInfo`)."""


def hook_imports(relay: bool) -> list[Operation]:
    """The hook contract imported before the runner's ssu_dispatch import, and the
    relay (a runner) or batch_runs_mamba_ssu alone (the V2 capture) added to it; a file
    without an ssu_dispatch import gets one after vllm.logger's."""
    names = (
        ("register_mamba_sr_seed_hook", "batch_runs_mamba_ssu")
        if relay
        else ("batch_runs_mamba_ssu",)
    )
    ssu_import = Find(
        "",
        f"`from {SSU_DISPATCH_MODULE} import ...`",
        imports_from(SSU_DISPATCH_MODULE),
        direct=True,
    )
    if relay:
        return [
            InsertStatements(
                why="import the hook contract",
                at=ssu_import,
                code=HOOKS_IMPORT,
                after=False,
            ),
            AddImportedNames(
                why="import the SSU's hook registration and batch_runs_mamba_ssu",
                at=ssu_import,
                names=names,
            ),
        ]
    return [
        InsertStatements(
            why="import the hook contract and batch_runs_mamba_ssu",
            at=Find("", "`from vllm.logger import ...`", imports_from("vllm.logger"), direct=True),
            code=HOOKS_IMPORT + f"from {SSU_DISPATCH_MODULE} import batch_runs_mamba_ssu\n",
        )
    ]


def _mentions_hooks(node: ast.AST) -> bool:
    return "forward_hooks" in ast.unparse(node)


def hooks_in_init(runner_class: str) -> InsertStatements:
    """The runner owns its ForwardHooks, the seed relay registered if the flag is
    set: at the end of __init__ (after its last statement that the patch did not
    add)."""
    return InsertStatements(
        why="the runner owns its forward hooks, the seed hook registered if the flag is set",
        at=Find(
            f"{runner_class}.__init__",
            "statement",
            lambda n: not _mentions_hooks(n),
            direct=True,
            pick="last",
        ),
        code="\n" + landing("runner_hooks_init.py"),
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
