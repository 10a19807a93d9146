"""What every GPU test runs under, and the fixtures the identity and stream tests share:
each design with each of its sync plans, each drawer, and a runner of them or of stock
(`make_runner`)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator

import pytest
import torch

from .harness import (
    FORWARD_CONTEXT_PLANS,
    OUTSIDE_GRAPHS_ONLY,
    TRITON_DRAWER,
    Runner,
    require_drawer,
)


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


DESIGNS = (("reset", None), *(("forward-context", plan) for plan in FORWARD_CONTEXT_PLANS))
"""Each design with each of its sync plans (None: the reset design's own stream)."""


@pytest.fixture(params=DESIGNS, ids=lambda d: d[0] if d[1] is None else f"{d[0]}-{d[1]}")
def design(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """A design and its sync plan."""
    return request.param


@pytest.fixture(params=["randint", "triton"])
def drawer(request: pytest.FixtureRequest) -> str:
    require_drawer(request.param)
    return request.param


@pytest.fixture
def make_runner(design: tuple[str, str | None], drawer: str) -> Callable[..., Runner]:
    """`make_runner(None)` is stock, `make_runner("design")` the design, on its plan
    and the drawer; `batch_size` is the runner's (default 1)."""
    name, plan = design
    if drawer == TRITON_DRAWER and name != "reset":
        pytest.skip(OUTSIDE_GRAPHS_ONLY)

    def make(which: str | None, batch_size: int = 1) -> Runner:
        if not which:
            return Runner(None, None, drawer, batch_size=batch_size)
        return Runner(name, plan, drawer, batch_size=batch_size)

    return make
