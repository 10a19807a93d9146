"""setup.py: the seed op's extension, `vllm._mamba_sr_C`, among those a CUDA build makes.

setup.py lists the CMake targets its build runs and installs (`ext_modules`,
each a `CMakeExtension`); the CUDA-only ones are appended in the module-level
`if _is_cuda():` block (FlashAttention's, FlashMLA's, DeepGEMM's), and the
seed op's goes last there (landing/setup_mamba_sr_extension.py), as the CMake
target it names exists for CUDA only (targets/cmake_lists.py).  Not in the
`_is_cuda() or _is_hip()` block that appends `_moe_C` or
`_moe_C_stable_libtorch`: a ROCm build would ask CMake for a target it has
not.  Only a source tree has setup.py; an installed vLLM gets the extension
from `sr-prefetch build-op`.
"""

from __future__ import annotations

import ast

from ..syntax import FileOperations, Find, InsertStatements, landing, same_syntax
from .cmake_lists import EXTENSION

PATH = "setup.py"
CODE = landing("setup_mamba_sr_extension.py")
MODULE = f"vllm.{EXTENSION}"


def _is_cuda_block(node: ast.AST) -> bool:
    """The module-level `if _is_cuda():` (no `or _is_hip()`)."""
    return isinstance(node, ast.If) and same_syntax("_is_cuda()")(node.test)


def _ours(node: ast.AST) -> bool:
    """The statement the patch adds."""
    return isinstance(node, ast.Expr) and same_syntax(CODE)(node.value)


def operations() -> FileOperations:
    return FileOperations(
        PATH,
        (
            InsertStatements(
                why=f"CUDA builds build and install the seed op's extension, {MODULE}",
                at=Find(
                    "",
                    "statement of the module-level `if _is_cuda():` block",
                    lambda node: not _ours(node),
                    within=_is_cuda_block,
                    direct=True,
                    pick="last",
                ),
                code=CODE,
            ),
        ),
    )
