"""vllm/model_executor/layers/mamba/ops/mamba_ssm.py: the Triton SSU's own seed draw.

Both designs.  Stock `selective_state_update` draws its stochastic-rounding
seed itself, `torch.randint(0, 2**32, (1,))` when `enable_stochastic_rounding`;
the patch lets a caller hand it one: an optional `rand_seed` parameter, last,
which stock's callers leave None, and the draw only when it is None.  The
Triton backend in ssu_dispatch.py passes the prefetched seed (or None).
"""

from __future__ import annotations

import ast

from ..releases import Design
from ..syntax import AddArgument, FileOperations, Find, WrapInIf, same_syntax

PATH = "vllm/model_executor/layers/mamba/ops/mamba_ssm.py"
FUNCTION = "selective_state_update"
STOCK_DRAW = """
rand_seed = (
    torch.randint(0, 2**32, (1,), device=state.device)
    if enable_stochastic_rounding
    else None
)
"""
"""Stock's draw statement, matched by its syntax."""


def operations(design: Design) -> FileOperations:
    del design  # both designs hand the Triton SSU its seed the same way
    return seed_parameter(PATH, FUNCTION)


def seed_parameter(path: str, function: str) -> FileOperations:
    """`function` of `path`, which draws as STOCK_DRAW, takes an optional rand_seed
    (last) and draws only when it is None: the Triton SSU here, and the Triton
    ReplaySSM (replayssm_triton.py)."""
    return FileOperations(
        path,
        (
            AddArgument(
                why=f"{function} takes an optional rand_seed (stock's callers leave it None)",
                at=Find(
                    "",
                    f"def {function}",
                    lambda n: isinstance(n, ast.FunctionDef) and n.name == function,
                ),
                code="rand_seed=None",
            ),
            WrapInIf(
                why=f"{function} draws its seed only when none is given",
                at=Find(
                    function,
                    "statement `rand_seed = torch.randint(...) if enable_stochastic_rounding "
                    "else None`",
                    same_syntax(STOCK_DRAW),
                ),
                code="rand_seed is None",
            ),
        ),
    )
