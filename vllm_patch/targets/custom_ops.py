"""vllm/_custom_ops.py: the Python wrapper of the seed op, `mamba_sr_stock_seeds`.

vLLM calls its compiled ops through the wrappers of _custom_ops.py; the seed op's
(landing/custom_ops_mamba_sr.py) goes after `selective_scan_fwd`'s, the Mamba
op every supported release wraps there.  It calls `torch.ops._mamba_sr_C`: the
op registers when `vllm._mamba_sr_C` is imported, built by a source tree's CMake
(targets/cmake_lists.py) or placed beside an installed vLLM by `sr-prefetch
build-op`.  Every target has this file; only the reset design edits it.
"""

from __future__ import annotations

import ast

from ..syntax import FileOperations, Find, InsertStatements, landing

PATH = "vllm/_custom_ops.py"
WRAPPER = "mamba_sr_stock_seeds"
AFTER = "selective_scan_fwd"


def operations() -> FileOperations:
    return FileOperations(
        PATH,
        (
            InsertStatements(
                why=f"{WRAPPER}, the seed op's wrapper, beside the other Mamba ops'",
                at=Find(
                    "",
                    f"def {AFTER}",
                    lambda node: isinstance(node, ast.FunctionDef) and node.name == AFTER,
                    direct=True,
                ),
                code="\n\n" + landing("custom_ops_mamba_sr.py"),
            ),
        ),
    )
