"""vllm/v1/worker/gpu_model_runner.py (the V1 runner), reset design only.

Two call sites cover every forward of the target model:
- execute_model: sr_seed_forward joins the `with` around `self._model_forward(...)`,
  beside `set_forward_context`: eager, PIECEWISE and FULL replay (inside
  CUDAGraphWrapper), micro-batched (UBatchWrapper splits inside the call).
- _dummy_run: likewise around `self.model(...)`: the profile run, warm-up, DP
  dummy batches and every capture (CUDAGraphWrapper captures inside the call).
"""

from __future__ import annotations

from ..releases import Release, Site
from ..syntax import AddWithItem, FileOperations, landing
from ._runner import (
    forward_context_names,
    forward_context_with,
    forward_import,
    is_forward_context_item,
)

PATH = "vllm/v1/worker/gpu_model_runner.py"

_EXECUTE_MODEL = forward_context_with("GPUModelRunner.execute_model", "self._model_forward")
_DUMMY_RUN = forward_context_with("GPUModelRunner._dummy_run", "self.model")


def operations(release: Release) -> FileOperations:
    del release  # every supported release has both sites
    item = landing("runner_forward_item.py")
    return FileOperations(
        PATH,
        (
            forward_import(runner=True),
            AddWithItem(
                why="execute_model: the model forward runs inside sr_seed_forward",
                site=Site.V1_EXECUTE_MODEL,
                at=_EXECUTE_MODEL,
                after_item=is_forward_context_item,
                code=item,
                names=forward_context_names(_EXECUTE_MODEL),
            ),
            AddWithItem(
                why="_dummy_run: profile, warm-up, capture and DP dummy forwards run inside "
                "sr_seed_forward",
                site=Site.V1_DUMMY_RUN,
                at=_DUMMY_RUN,
                after_item=is_forward_context_item,
                code=item,
                names=forward_context_names(_DUMMY_RUN),
            ),
        ),
    )
