"""The outside-graph arm's hooks on vLLM's V2 runner (bench/outside_graph.py).

V2 replays a FULL graph in `ModelCudaGraphManager.run_fullgraph`, with no Python
forward and so no runner hook: `wrap_v2` opens the prefetcher's forward around each
replay, which draws the replay's seeds eagerly before the graph runs. It draws as
many as the graph's capture took: `CudaGraphManager.capture` is wrapped to note,
per FULL descriptor, the seeds its captured forward took (V2 opens the runner hook
inside torch.cuda.graph there, so that forward draws nothing; see
bench/outside_graph.py). The names are those of vLLM 0.26.0 to 0.33.0
(vllm/v1/worker/gpu/cudagraph_utils.py); bench/engine/test_outside_graph_v2.py
checks them against each release's source.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

TOOK = "_sr_outside_graph_took"
"""The manager's attribute: FULL descriptor -> seeds its graph reads."""
WRAPPED = "_sr_outside_graph_wrapped"


class V2LayoutError(RuntimeError):
    """vLLM's V2 graph manager lacks what the outside-graph arm wraps."""


def wrap_v2(cudagraph_utils: Any, current: Callable[[], Any]) -> None:
    """Wraps `cudagraph_utils`' CudaGraphManager.capture and
    ModelCudaGraphManager.run_fullgraph, once; `current()` is the live
    OutsideGraphPrefetcher, or None."""
    try:
        base = cudagraph_utils.CudaGraphManager
        model = cudagraph_utils.ModelCudaGraphManager
        full = cudagraph_utils.CUDAGraphMode.FULL
    except AttributeError as missing:
        raise V2LayoutError(
            f"{cudagraph_utils.__name__} lacks {missing.name}: this vLLM's V2 graph "
            "manager is not 0.26.0-0.33.0's; run the outside-graph arm on V1 only"
        ) from None
    if getattr(base.capture, WRAPPED, False):
        return
    capture, run_fullgraph = base.capture, model.run_fullgraph

    @functools.wraps(capture)
    def capturing(self: Any, create_forward_fn: Callable[..., Any], *args: Any, **kwargs: Any):
        took: dict[Any, int] = self.__dict__.setdefault(TOOK, {})

        def observed(desc: Any, warmup: bool) -> Callable[[Any], None]:
            forward_fn = create_forward_fn(desc, warmup)
            if warmup or desc.cg_mode != full:
                return forward_fn

            def captured(cg_mode: Any) -> None:
                prefetcher = current()
                if prefetcher is not None:
                    prefetcher.last_capture_took = 0
                forward_fn(cg_mode)
                took[desc] = 0 if prefetcher is None else prefetcher.last_capture_took

            return captured

        return capture(self, observed, *args, **kwargs)

    @functools.wraps(run_fullgraph)
    def replaying(self: Any, desc: Any) -> Any:
        prefetcher = current()
        count = self.__dict__.get(TOOK, {}).get(desc, 0)
        if prefetcher is None or not count:
            return run_fullgraph(self, desc)
        with prefetcher.forward(full_cudagraph=True, count=count):
            return run_fullgraph(self, desc)

    setattr(capturing, WRAPPED, True)
    base.capture = capturing
    model.run_fullgraph = replaying
