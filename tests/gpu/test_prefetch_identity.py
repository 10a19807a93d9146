"""Both designs give stock's seeds, value by value, in every mode a model runner uses.

Each test runs one script through stock and through a design (tests/gpu/harness.py)
from the same generator state and compares what the consumers read.
"""

from __future__ import annotations

import logging

import pytest
import torch

from runner_hooks import WrongStreamError

from .harness import (
    DECODE,
    FULL_GRAPH,
    MICRO_BATCHED,
    NUM_LAYERS,
    PREFILL,
    Runner,
    assert_same_seeds,
    run_both,
)

pytestmark = pytest.mark.gpu


def test_eager_forwards(make_runner) -> None:
    def script(runner: Runner) -> list[torch.Tensor]:
        return [runner.decode() for _ in range(5)]

    assert_same_seeds(*run_both(script, make_runner))


def test_calls_beyond_n_draw_inline_after_the_prefetched_seeds(make_runner) -> None:
    def script(runner: Runner) -> list[torch.Tensor]:
        return [runner.decode(NUM_LAYERS + 3), runner.decode(), runner.decode(NUM_LAYERS + 1)]

    assert_same_seeds(*run_both(script, make_runner))


def test_calls_outside_any_forward(make_runner) -> None:
    def script(runner: Runner) -> list[torch.Tensor]:
        outside = runner.new_record(3)
        if runner.prefetcher is not None:
            assert runner.prefetcher.next_seed() is None
        runner.layers(outside, 3)
        return [runner.decode(), outside, runner.decode()]

    assert_same_seeds(*run_both(script, make_runner))


def test_prefill_only_forwards_interleaved_with_decodes(make_runner) -> None:
    def script(runner: Runner) -> list[torch.Tensor]:
        records = []
        for step in range(6):
            if step % 3 == 1:
                with runner.forward(PREFILL):
                    records.append(torch.randint(0, 2**32, (2,), device=runner.device))
            else:
                records.append(runner.decode())
        return records

    assert_same_seeds(*run_both(script, make_runner))


def test_micro_batched_forwards_fall_back_to_stock(make_runner) -> None:
    def script(runner: Runner) -> list[torch.Tensor]:
        records = [runner.decode()]
        record = runner.new_record()
        with runner.forward(MICRO_BATCHED):
            if runner.prefetcher is not None:
                assert runner.prefetcher.next_seed() is None
            runner.layers(record)
        return [*records, record, runner.decode()]

    assert_same_seeds(*run_both(script, make_runner))


def capture(runner: Runner, record: torch.Tensor, hook_inside: bool, **graph_kwargs):
    """Captures one forward as a FULL graph, the hook outside (V1) or inside (V2) the capture."""
    graph = torch.cuda.CUDAGraph()
    if hook_inside:
        with torch.cuda.graph(graph, **graph_kwargs), runner.forward(FULL_GRAPH):
            runner.layers(record)
    else:
        with runner.forward(FULL_GRAPH), torch.cuda.graph(graph, **graph_kwargs):
            runner.layers(record)
    return graph


def replay(runner: Runner, graph: torch.cuda.CUDAGraph, record: torch.Tensor) -> torch.Tensor:
    with runner.forward(FULL_GRAPH):
        graph.replay()
    return record.clone()


@pytest.mark.parametrize("hook_inside", [False, True], ids=["hook_outside", "hook_inside"])
def test_graph_capture_and_replays(make_runner, hook_inside: bool) -> None:
    def script(runner: Runner) -> list[torch.Tensor]:
        records = [runner.decode()]  # warm-up, as vLLM does before capture
        record = runner.new_record()
        graph = capture(runner, record, hook_inside)
        records += [replay(runner, graph, record) for _ in range(3)]
        return [*records, runner.decode()]

    stock, ours = run_both(script, make_runner)
    assert_same_seeds(stock, ours)
    replays = [tuple(record.tolist()) for record in ours[1:4]]
    assert len(set(replays)) == 3, "each replay draws fresh seeds"


def test_eager_forwards_and_graphs_of_several_batch_sizes_sharing_a_pool(make_runner) -> None:
    def script(runner: Runner) -> list[torch.Tensor]:
        pool = torch.cuda.graph_pool_handle()
        graphs = {}
        for batch_size in (4, 2, 1):  # vLLM captures the largest first
            # Each graph keeps its own static input, as vLLM's padded batches do.
            activations = torch.ones(batch_size, 1 << 14, device=runner.device)
            runner.activations = activations
            record = runner.new_record()
            graphs[batch_size] = (capture(runner, record, False, pool=pool), record, activations)
        runner.activations = torch.ones(3, 1 << 14, device=runner.device)
        records = []
        for step in (None, 1, None, 4, 2, 1, "prefill", 2, None, 4):
            if step is None:
                records.append(runner.decode())
            elif step == "prefill":
                with runner.forward(PREFILL):
                    pass
            else:
                graph, record, _ = graphs[step]
                records.append(replay(runner, graph, record))
        return records

    assert_same_seeds(*run_both(script, make_runner))


def slow_consumers(runner: Runner) -> list[torch.Tensor]:
    """Forwards whose consumers lag far behind the host, which schedules the next draws."""
    records = [runner.new_record() for _ in range(6)]
    for record in records:
        with runner.forward(DECODE):
            runner.layers(record, sleep_cycles=200_000)
    return records


def test_slow_consumers_read_their_own_seeds_while_later_draws_are_scheduled(
    make_runner,
) -> None:
    assert_same_seeds(*run_both(slow_consumers, make_runner))


@pytest.mark.parametrize("consumed", [0, 1, NUM_LAYERS - 1])
def test_reset_eager_forward_that_leaves_seeds_warns_once(
    sync_plan: str, drawer: str, consumed: int, caplog: pytest.LogCaptureFixture
) -> None:
    runner = Runner("reset", sync_plan, drawer)
    with caplog.at_level(logging.WARNING, logger="runner_hooks"):
        for _ in range(2):
            runner.decode(consumed)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"consumed {consumed} of the {NUM_LAYERS} seeds" in warnings[0]


def test_reset_capture_that_leaves_seeds_warns_and_captures(
    sync_plan: str, drawer: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A performance option never stops an engine: the capture ends cleanly."""
    runner = Runner("reset", sync_plan, drawer)
    runner.decode()
    record = runner.new_record()
    graph = torch.cuda.CUDAGraph()
    with (
        caplog.at_level(logging.WARNING, logger="runner_hooks"),
        torch.cuda.graph(graph),
        runner.forward(FULL_GRAPH),
    ):
        runner.layers(record, calls=1)
    graph.replay()
    torch.cuda.synchronize()  # the capture ended cleanly: the device is fine
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("captured forward consumed 1 of the" in w for w in warnings), warnings


def test_reset_seeds_drawn_eagerly_are_not_handed_to_a_capture(
    sync_plan: str, drawer: str, caplog: pytest.LogCaptureFixture
) -> None:
    runner = Runner("reset", sync_plan, drawer)
    runner.decode()
    graph = torch.cuda.CUDAGraph()
    with runner.forward(DECODE):  # drawn eagerly as the forward began
        with torch.cuda.graph(graph):
            seed = runner.prefetcher.next_seed()  # type: ignore[union-attr]
            inline = torch.randint(0, 2**32, (1,), device=runner.device)
        assert seed is None, "a graph must not read seeds drawn outside it"
    graph.replay()
    assert inline.tolist()
    assert any("consumed 0 of the" in r.getMessage() for r in caplog.records)


def test_a_seed_taken_on_another_stream_is_refused(sync_plan: str, drawer: str) -> None:
    runner = Runner("reset", sync_plan, drawer)
    with (
        runner.forward(DECODE),
        torch.cuda.stream(torch.cuda.Stream()),
        pytest.raises(WrongStreamError, match="must run on the stream"),
    ):
        runner.prefetcher.next_seed()  # type: ignore[union-attr]


class StreamThatSkipsWaits(torch.cuda.Stream):
    """A side stream that ignores the fork event: the race the fork prevents."""

    def wait_event(self, event: torch.cuda.Event) -> None:
        pass


def test_the_stress_test_catches_draws_that_skip_the_fork() -> None:
    """Proves the slow-consumer test can fail: without the fork, draws overrun readers."""

    def make(which: str | None) -> Runner:
        runner = Runner("reset" if which else None, "single", "randint")
        if which:
            runner.prefetcher.prefetch._side_stream = StreamThatSkipsWaits()  # type: ignore[union-attr]
        return runner

    with pytest.raises(AssertionError, match="record"):
        assert_same_seeds(*run_both(slow_consumers, make))


def alternating_streams(runner: Runner) -> list[torch.Tensor]:
    """Consecutive eager forwards on two streams, each forward's consumers stalled
    behind a long sleep while the host goes on to schedule the next forward's
    draws on the other stream (the V2 runner warms up on one stream and serves on
    another)."""
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    records = [runner.new_record() for _ in range(6)]
    for index, record in enumerate(records):
        with torch.cuda.stream(streams[index % 2]), runner.forward(DECODE):
            torch.cuda._sleep(2_000_000)  # the GPU is busy before the forward's SSU calls
            runner.layers(record)
    for stream in streams:
        torch.cuda.current_stream().wait_stream(stream)
    return records


def test_consecutive_forwards_on_alternating_streams(make_runner) -> None:
    assert_same_seeds(*run_both(alternating_streams, make_runner))


def test_the_stream_test_catches_draws_without_the_handover() -> None:
    """Proves the alternating-streams test can fail: without the handover event,
    the second stream's draws overwrite seeds the first stream has yet to read."""

    class NoHandover(torch.cuda.Event):
        def record(self, stream=None) -> None:
            super().record(torch.cuda.Stream())  # recorded on an idle stream: no order

    def make(which: str | None) -> Runner:
        runner = Runner("reset" if which else None, "current_stream", "randint")
        if which:
            runner.prefetcher.prefetch._handover = NoHandover()  # type: ignore[union-attr]
        return runner

    with pytest.raises(AssertionError, match="record"):
        assert_same_seeds(*run_both(alternating_streams, make))


SCRIPTS = (
    test_eager_forwards,
    test_calls_beyond_n_draw_inline_after_the_prefetched_seeds,
    test_calls_outside_any_forward,
    test_prefill_only_forwards_interleaved_with_decodes,
    test_micro_batched_forwards_fall_back_to_stock,
    test_eager_forwards_and_graphs_of_several_batch_sizes_sharing_a_pool,
    test_slow_consumers_read_their_own_seeds_while_later_draws_are_scheduled,
    test_consecutive_forwards_on_alternating_streams,
)
"""The scripts above that take any prefetcher's make_runner: bench's prefetchers
(tests/gpu/test_outside_graph.py, test_checked_once.py) run them as they are."""


def script_name(script) -> str:
    return script.__name__.removeprefix("test_")
