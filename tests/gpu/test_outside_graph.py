"""The outside-graph prefetcher (bench/outside_graph.py) gives stock's seeds, value by
value, and leaves the generator where stock does, eagerly and under CUDA-graph capture
and replays, with the hook outside the capture (V1) or inside it (V2); no graph it
captures draws. The controls show the tests fail without the rewind after a capture
and without the draw before a replay."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from bench import outside_graph

from . import test_prefetch_identity as scripts
from .harness import FULL_GRAPH, Runner, assert_same_seeds, require_drawer, run_both

pytestmark = pytest.mark.gpu


@pytest.fixture(params=["randint", "kernel"])
def make_runner(request: pytest.FixtureRequest) -> Callable[..., Runner]:
    require_drawer(request.param)

    def make(which: str | None, batch_size: int = 1) -> Runner:
        return Runner(
            "outside-graph" if which else None, None, request.param, batch_size=batch_size
        )

    return make


@pytest.mark.parametrize("script", scripts.SCRIPTS, ids=scripts.script_name)
def test_the_reset_designs_identity_tests(make_runner, script) -> None:
    script(make_runner)


@pytest.mark.parametrize("hook_inside", [False, True], ids=["hook_outside", "hook_inside"])
def test_graph_capture_and_replays(make_runner, hook_inside: bool) -> None:
    scripts.test_graph_capture_and_replays(make_runner, hook_inside)


def captured_then_replayed(hook_inside: bool) -> Callable[[Runner], list[torch.Tensor]]:
    def script(runner: Runner) -> list[torch.Tensor]:
        records = [runner.decode()]
        record = runner.new_record()
        graph = scripts.capture(runner, record, hook_inside)
        records += [scripts.replay(runner, graph, record) for _ in range(3)]
        return [*records, runner.decode()]

    return script


@pytest.mark.parametrize("hook_inside", [False, True], ids=["hook_outside", "hook_inside"])
def test_no_graph_draws(make_runner, hook_inside: bool) -> None:
    """A replay outside any forward leaves the generator where it is: no RNG in the graph."""
    runner = make_runner("design")
    runner.decode()
    record = runner.new_record()
    graph = scripts.capture(runner, record, hook_inside)
    torch.cuda.synchronize()
    before = torch.cuda.get_rng_state()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(before, torch.cuda.get_rng_state())


def test_the_capture_test_fails_without_the_rewind(
    make_runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: with the hook outside the capture, the eager draw before it must be
    taken back; without that, the generator ends 4N offsets past stock's."""
    monkeypatch.setattr(outside_graph, "rewind_generator", lambda index, offsets: None)
    with pytest.raises(AssertionError, match="the generator ends where stock leaves it"):
        run_both(captured_then_replayed(hook_inside=False), make_runner)


def test_the_replay_test_fails_without_the_draw_before_a_replay(make_runner) -> None:
    """Control: replayed outside any forward, the graph reads the last forward's seeds."""

    def script(runner: Runner) -> list[torch.Tensor]:
        records = [runner.decode()]
        record = runner.new_record()
        graph = scripts.capture(runner, record, hook_inside=True)
        for _ in range(3):
            if runner.prefetcher is None:
                with runner.forward(FULL_GRAPH):
                    graph.replay()
            else:
                graph.replay()  # no hook: nothing drawn for this replay
            records.append(record.clone())
        return records

    with pytest.raises(AssertionError, match=r"generator ends where stock|record"):
        assert_same_seeds(*run_both(script, make_runner))
