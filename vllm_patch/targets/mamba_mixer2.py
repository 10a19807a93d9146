"""vllm/model_executor/layers/mamba/mamba_mixer2.py: the Triton ReplaySSM call.

Both designs, where the release has the Triton ReplaySSM kernel's wrapper (0.27.0
on; releases.FILES_SINCE), which `MambaMixer2.conv_ssm_forward` calls directly, not
through ssu_dispatch.py; the call passes it `rand_seed=prefetched_sr_seed()`,
which is None (the wrapper then draws as stock) wherever the SSU backends would
draw inline.
"""

from __future__ import annotations

import ast

from ..releases import Design
from ..syntax import (
    AddArgument,
    AddImportedNames,
    FileOperations,
    Find,
    Source,
    imports_from,
    is_call,
)
from .replayssm_triton import FUNCTION as CALL

PATH = "vllm/model_executor/layers/mamba/mamba_mixer2.py"
SSU_DISPATCH = "vllm.model_executor.layers.mamba.ops.ssu_dispatch"
SEED = "prefetched_sr_seed"


def has_call(source: Source) -> bool:
    """Whether the file calls the Triton ReplaySSM wrapper (0.27.0 on)."""
    return any(is_call(node, CALL) for node in ast.walk(source.tree))


def operations(design: Design) -> FileOperations:
    del design  # both designs hand the Triton ReplaySSM its seed the same way
    return FileOperations(
        PATH,
        (
            AddImportedNames(
                why=f"mamba_mixer2.py imports {SEED} from ssu_dispatch.py",
                at=Find("", f"`from {SSU_DISPATCH} import ...`", imports_from(SSU_DISPATCH)),
                names=(SEED,),
            ),
            AddArgument(
                why="the Triton ReplaySSM call passes the prefetched seed",
                at=Find(
                    "MambaMixer2.conv_ssm_forward",
                    f"call of {CALL}",
                    lambda n: is_call(n, CALL),
                    expression=True,
                ),
                code=f"rand_seed={SEED}()",
            ),
        ),
    )
