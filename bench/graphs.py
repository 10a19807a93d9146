"""Capturing a decode step as a FULL CUDA graph, as vLLM's FULL cudagraph mode does."""

from __future__ import annotations

import torch

from .synthetic_model import DecodeModel
from .variants import SeedSource, run_step

WARMUP_STEPS = 2
"""Eager steps before a capture: FlashInfer's JIT module, cuBLAS handles, the
allocator's blocks and a drawer's build must all exist before capture starts,
since none of them may be created while a stream is capturing."""


def capture_step(
    model: DecodeModel, source: SeedSource, record: torch.Tensor | None = None
) -> torch.cuda.CUDAGraph:
    """One step of `model` with `source`'s seed path, captured after a few eager warm-up steps.

    The forward scope is told `captured=True`, as vLLM's runner tells
    `sr_seed_forward` for a FULL graph (full_cudagraph=True); the graph has its own
    memory pool, so the seed buffers a prefetcher allocates during capture (the
    forward-context design's) belong to this graph alone.
    A source with `around_replay` (the reset design's) gets the graph back wrapped by
    it, so every replay opens its forward first.
    """
    for _ in range(WARMUP_STEPS):
        run_step(model, source, captured=False, record=record)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_step(model, source, captured=True, record=record)
    torch.cuda.synchronize()
    around_replay = getattr(source, "around_replay", None)
    return graph if around_replay is None else around_replay(graph)
