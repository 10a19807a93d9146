"""What every GPU test runs under, and the fixtures the identity and stream tests share:
each design, sync plan and drawer, and a runner of them or of stock (`make_runner`)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator

import pytest
import torch

from bench.sync import SYNC_PLANS

from .harness import Runner, require_drawer


@pytest.fixture(autouse=True)
def no_graph_freed_during_a_capture() -> Iterator[None]:
    """Dead CUDA graphs are freed before a capture, never during one.

    torch collects garbage as a capture begins only with
    `torch.compiler.config.force_cudagraph_gc` (off by default). A test that
    catches an exception raised under a capture keeps its CUDAGraph in a
    reference cycle (traceback -> frame -> graph); an automatic collection in
    the middle of a later test's capture then destroys that graph, which a
    global-mode capture does not permit: the capture is invalidated and every
    later capture and CUDA RNG call of the process fails. So collect as each
    capture begins, and after each test.
    """
    with torch.compiler.config.patch(force_cudagraph_gc=True):
        yield
    gc.collect()


@pytest.fixture(params=["reset", "forward-context"])
def design(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=sorted(SYNC_PLANS))
def sync_plan(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=["randint", "kernel"])
def drawer(request: pytest.FixtureRequest) -> str:
    require_drawer(request.param)
    return request.param


@pytest.fixture
def make_runner(design: str, sync_plan: str, drawer: str) -> Callable[..., Runner]:
    """`make_runner(None)` is stock, `make_runner("design")` the design, on the same plan
    and drawer; `batch_size` is the runner's (default 1)."""

    def make(which: str | None, batch_size: int = 1) -> Runner:
        return Runner(design if which else None, sync_plan, drawer, batch_size=batch_size)

    return make
