"""vllm/model_executor/layers/mamba/ops/selective_state_update_replayssm_output_only.py:
the Triton ReplaySSM kernel's own seed draw (the file arrived in 0.27.0).

Both designs.  With ReplaySSM on (`cache_config.use_replayssm`) and the Triton
backend, each Mamba-2 layer's decode calls `selective_state_update_replayssm_output_only`
from mamba_mixer2.py instead of the SSU, and it draws its seed as
`selective_state_update` does.  The patch gives it the same optional `rand_seed`
(mamba_ssm.py's `seed_parameter`), and mamba_mixer2.py's call passes the
prefetched seed (targets/mamba_mixer2.py).
"""

from __future__ import annotations

from ..releases import FILES_SINCE, Design
from ..syntax import FileOperations
from .mamba_ssm import seed_parameter

PATH = "vllm/model_executor/layers/mamba/ops/selective_state_update_replayssm_output_only.py"
FUNCTION = "selective_state_update_replayssm_output_only"
assert PATH in FILES_SINCE


def operations(design: Design) -> FileOperations:
    del design  # both designs hand it its seed the same way
    return seed_parameter(PATH, FUNCTION)
