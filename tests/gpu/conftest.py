"""What every GPU test runs under."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def no_graph_freed_during_a_capture() -> Iterator[None]:
    """Dead CUDA graphs are freed before a capture, never during one.

    torch no longer collects garbage as a capture begins
    (`torch.compiler.config.force_cudagraph_gc`, off by default). A test that
    catches an exception raised under a capture keeps its CUDAGraph in a
    reference cycle (traceback -> frame -> graph); an automatic collection in
    the middle of a later test's capture then destroys that graph, which a
    global-mode capture does not permit: the capture is invalidated and every
    later capture and CUDA RNG call of the process fails. On the H200
    (2026-11-30) one such collection failed 69 tests after it. So collect as
    each capture begins, as torch used to, and after each test.
    """
    with torch.compiler.config.patch(force_cudagraph_gc=True):
        yield
    gc.collect()
