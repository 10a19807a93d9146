"""vllm/model_executor/layers/mamba/ops/ssu_dispatch.py: where the seeds are handed out.

Both designs: `FlashInferSSUBackend.__call__` and
`selective_state_update_replayssm_flashinfer` (ReplaySSM, 0.30.0 on) take their
seed from `sr_rand_seed` (the prefetched one, else drawn as stock),
`TritonSSUBackend.__call__` hands `prefetched_sr_seed()` to
`selective_state_update` (mamba_ssm.py, which draws as stock when it is None), and
`initialize_mamba_ssu_backend` attaches a prefetcher where it applies.  The
designs differ in the prefetcher they attach and in what the runners see: the
reset design adds `sr_seed_forward`, which the runners wrap each forward in.
"""

from __future__ import annotations

import ast

from ..releases import Design
from ..syntax import (
    AddArgument,
    FileOperations,
    Find,
    InsertStatements,
    Operation,
    ReplaceExpression,
    Source,
    imports_from,
    is_call,
    landing,
    only_where,
    same_syntax,
    stdlib_import,
)

PATH = "vllm/model_executor/layers/mamba/ops/ssu_dispatch.py"
VENDORED_MODULE = "vllm.model_executor.layers.mamba.ops.sr_seed_prefetch"

STOCK_DRAW = "torch.randint(0, 2**32, (1,), device=state.device)"
"""Stock's per-call draw in FlashInferSSUBackend.__call__, matched by its syntax."""
PATCHED_DRAW = "sr_rand_seed(state.device)"

INIT = "initialize_mamba_ssu_backend"


def _mamba_types(source: Source) -> dict[str, str]:
    """How this release names the Mamba-1 and Mamba-2 types, read off the check
    `mamba_type in (MAMBA1, MAMBA2)` of initialize_mamba_ssu_backend."""
    check = Find(
        INIT,
        "check `kv_cache_spec.mamba_type in (<Mamba-1>, <Mamba-2>)`",
        lambda n: (
            isinstance(n, ast.Compare)
            and isinstance(n.ops[0], ast.In)
            and ast.unparse(n.left).endswith("kv_cache_spec.mamba_type")
            and isinstance(n.comparators[0], ast.Tuple)
            and len(n.comparators[0].elts) == 2
        ),
        expression=True,
    ).node(source)
    assert isinstance(check, ast.Compare) and isinstance(check.comparators[0], ast.Tuple)
    mamba1, mamba2 = check.comparators[0].elts
    return {"MAMBA1_TYPE": source.segment(mamba1), "MAMBA2_TYPE": source.segment(mamba2)}


def _has_replayssm(source: Source) -> bool:
    """Whether initialize_mamba_ssu_backend takes `use_replayssm` (0.30.0 on), which
    comes with FlashInfer's ReplaySSM call, REPLAYSSM."""
    function = Find("", f"def {INIT}", lambda n: isinstance(n, ast.FunctionDef) and n.name == INIT)
    node = function.node(source)
    assert isinstance(node, ast.FunctionDef)
    return "use_replayssm" in [a.arg for a in (*node.args.args, *node.args.kwonlyargs)]


def _replayssm_argument(source: Source) -> dict[str, str]:
    """`use_replayssm` passed on where initialize_mamba_ssu_backend takes it (0.30.0 on)."""
    return {"USE_REPLAYSSM": "use_replayssm" if _has_replayssm(source) else "False"}


REPLAYSSM = "selective_state_update_replayssm_flashinfer"
REPLAYSSM_DRAW = """rand_seed = (
        torch.randint(0, 2**32, (1,), device=state.device, dtype=torch.int64)
        if enable_stochastic_rounding
        else None
    )"""
"""Stock's draw statement in FlashInfer's ReplaySSM call, matched by its syntax, and
written back as here (the function body's indentation) on revert."""
REPLAYSSM_PATCHED = "rand_seed = sr_rand_seed(state.device) if enable_stochastic_rounding else None"


def _replayssm_operations() -> list[Operation]:
    """FlashInfer's ReplaySSM call takes its seed from sr_rand_seed, where the release
    has it (a file without use_replayssm has no ReplaySSM). The statement is replaced
    whole: with the shorter call it fits on one line, as ruff formats it."""
    return [
        only_where(
            _has_replayssm,
            ReplaceExpression(
                why=f"{REPLAYSSM} takes rand_seed from the prefetcher, else inline",
                at=Find(
                    REPLAYSSM,
                    "statement `rand_seed = torch.randint(...) if enable_stochastic_rounding "
                    "else None`",
                    same_syntax(REPLAYSSM_DRAW),
                ),
                code=REPLAYSSM_PATCHED,
                patched=Find(
                    REPLAYSSM, f"statement `{REPLAYSSM_PATCHED}`", same_syntax(REPLAYSSM_PATCHED)
                ),
                original=REPLAYSSM_DRAW,
            ),
        ),
    ]


def _import_line(code: str, why: str, anchor: str, after: bool) -> InsertStatements:
    return InsertStatements(
        why=why,
        at=Find("", f"`from {anchor} import ...`", imports_from(anchor), direct=True),
        code=code,
        after=after,
    )


def _shared(design: Design) -> list[Operation]:
    """What both designs do, less the design's own imports, state and helpers."""
    return [
        _import_line(
            "import vllm.envs as envs\n",
            "import vllm.envs for the gate",
            "vllm.config.mamba",
            after=False,
        ),
        ReplaceExpression(
            why="FlashInferSSUBackend.__call__ takes rand_seed from the prefetcher, else inline",
            at=Find(
                "FlashInferSSUBackend.__call__",
                f"`{STOCK_DRAW}`",
                same_syntax(STOCK_DRAW),
                expression=True,
            ),
            code=PATCHED_DRAW,
            patched=Find(
                "FlashInferSSUBackend.__call__",
                f"`{PATCHED_DRAW}`",
                lambda n: is_call(n, "sr_rand_seed"),
                expression=True,
            ),
            original=STOCK_DRAW,
        ),
        AddArgument(
            why="TritonSSUBackend.__call__ hands selective_state_update the prefetched seed "
            "(None: it draws as stock)",
            at=Find(
                "TritonSSUBackend.__call__",
                "call of `self._kernel`",
                lambda n: is_call(n, "self._kernel"),
                expression=True,
            ),
            code="rand_seed=prefetched_sr_seed()",
        ),
        InsertStatements(
            why=f"{INIT} attaches the seed prefetcher where it applies",
            at=Find(
                INIT,
                "early return for KV cache configs without Mamba layers",
                lambda n: (
                    isinstance(n, ast.If)
                    and len(n.body) == 1
                    and isinstance(n.body[0], ast.Return)
                    and "MambaSpec" in ast.unparse(n.test)
                ),
                direct=True,
                pick="first",
            ),
            code="\n" + landing("ssu_attach_call.py"),
            names=_replayssm_argument,
            join_if_it_fits=True,
        ),
        *_replayssm_operations(),
    ]


def _module_state(code: str, why: str) -> InsertStatements:
    return InsertStatements(
        why=why,
        at=Find(
            "",
            "`_mamba_ssu_backend` declaration",
            lambda n: (
                isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "_mamba_ssu_backend"
            ),
            direct=True,
        ),
        code="\n" + code,
    )


def _helpers(design_code: str, why: str) -> InsertStatements:
    return InsertStatements(
        why=why,
        at=Find(
            "",
            "def get_mamba_ssu_backend",
            lambda n: isinstance(n, ast.FunctionDef) and n.name == "get_mamba_ssu_backend",
            direct=True,
        ),
        code=landing("ssu_gate.py") + "\n\n" + design_code + "\n\n",
        after=False,
        names=_mamba_types,
    )


def operations(design: Design) -> FileOperations:
    if design is Design.RESET:
        own: list[Operation] = [
            InsertStatements(
                why="contextlib for the runners' per-forward context",
                at=Find(
                    "",
                    "import of the standard library that sorts before contextlib",
                    lambda n: (
                        stdlib_import(n)
                        and isinstance(n, ast.ImportFrom)
                        and (n.module or "") < "contextlib"
                    ),
                    direct=True,
                    pick="last",
                ),
                code="from contextlib import AbstractContextManager, nullcontext\n",
            ),
            InsertStatements(
                why="typing.Any for sr_seed_forward's signature",
                at=Find(
                    "",
                    "import of the standard library",
                    lambda n: stdlib_import(n) and not imports_from("typing")(n),
                    direct=True,
                    pick="last",
                ),
                code="from typing import Any\n",
            ),
            _import_line(
                f"from {VENDORED_MODULE} import (\n    SeedPrefetch,\n    SRSeedPrefetcher,\n"
                "    fill_randint_seeds,\n)\n",
                "import the vendored prefetcher and its Triton draw",
                "vllm.logger",
                after=True,
            ),
            _module_state(
                landing("ssu_state_reset.py"),
                "module state: the attached prefetcher, and the layer whose metadata tells "
                "whether a batch runs the SSU",
            ),
            _helpers(
                landing("ssu_reset.py"),
                "the gate, and sr_seed_forward: what the model runners wrap each forward in",
            ),
        ]
    else:
        own = [
            _import_line(
                "from vllm.forward_context import (\n    ForwardContext,\n"
                "    get_forward_context,\n    is_forward_context_available,\n)\n",
                "import the forward context, which tells one forward from the next",
                "vllm.logger",
                after=False,
            ),
            _import_line(
                f"from {VENDORED_MODULE} import (\n    ForwardContextSeedPrefetcher,\n)\n",
                "import the vendored prefetcher",
                "vllm.logger",
                after=True,
            ),
            _import_line(
                "from vllm.v1.worker.ubatching import dbo_enabled\n",
                "import DBO's thread registry, which tells micro-batches apart",
                "vllm.v1.kv_cache_interface",
                after=True,
            ),
            _module_state(
                landing("ssu_state_forward_context.py"), "module state: the attached prefetcher"
            ),
            _helpers(
                landing("ssu_forward_context.py"),
                "the gate, and how the prefetcher sees forwards and micro-batches",
            ),
        ]
    return FileOperations(PATH, (*_shared(design), *own))
