"""The reset design with its checks once per forward (bench/checked_once.py) gives
stock's seeds, value by value, eagerly and under CUDA-graph capture and replays, and
still refuses seeds eagerly drawn to a capture and consumers on another stream. That
each check is what keeps its guarantee: bench/test_checked_once.py (mutations)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from runner_hooks import WrongStreamError

from . import test_prefetch_identity as scripts
from .harness import DECODE, Runner, require_drawer

pytestmark = pytest.mark.gpu


@pytest.fixture(params=["randint", "kernel"])
def drawer(request: pytest.FixtureRequest) -> str:
    require_drawer(request.param)
    return request.param


@pytest.fixture
def make_runner(drawer: str) -> Callable[..., Runner]:
    def make(which: str | None, batch_size: int = 1) -> Runner:
        return Runner("checked-once" if which else None, None, drawer, batch_size=batch_size)

    return make


@pytest.mark.parametrize("script", scripts.SCRIPTS, ids=scripts.script_name)
def test_the_reset_designs_identity_tests(make_runner, script) -> None:
    script(make_runner)


@pytest.mark.parametrize("hook_inside", [False, True], ids=["hook_outside", "hook_inside"])
def test_graph_capture_and_replays(make_runner, hook_inside: bool) -> None:
    scripts.test_graph_capture_and_replays(make_runner, hook_inside)


def test_seeds_drawn_eagerly_are_not_handed_to_a_capture(make_runner) -> None:
    runner = make_runner("design")
    runner.decode()
    graph = torch.cuda.CUDAGraph()
    with runner.forward(DECODE):  # drawn eagerly as the forward began
        with torch.cuda.graph(graph):
            seed = runner.prefetcher.next_seed()
            inline = torch.randint(0, 2**32, (1,), device=runner.device)
        assert seed is None, "a graph must not read seeds drawn outside it"
    graph.replay()
    assert inline.tolist()


@pytest.mark.parametrize("moved_after", [0, 1], ids=["first_seed", "after_the_first"])
def test_a_forward_on_another_stream_is_refused(make_runner, moved_after: int) -> None:
    runner = make_runner("design")
    with runner.forward(DECODE):
        for _ in range(moved_after):
            runner.prefetcher.next_seed()
        with (
            torch.cuda.stream(torch.cuda.Stream()),
            pytest.raises(WrongStreamError, match="must run on the stream"),
        ):
            for _ in range(runner.num_layers):
                runner.prefetcher.next_seed()
