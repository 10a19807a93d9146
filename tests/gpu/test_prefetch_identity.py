"""Both designs give stock's seeds, value by value and in the generator's state, in
every mode a model runner uses: eager forwards, and FULL graphs captured as V1 and V2
capture them and replayed; and the reset design's checks at a forward's first and last
seed refuse what they must.

Each identity test runs one script through stock and through a design
(tests/gpu/harness.py) from the same generator state and compares what the consumers
read, and where the generator ends.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from runner_hooks.core import prefetch as prefetch_module

from .harness import (
    CAPTURE_STYLES,
    DECODE,
    MICRO_BATCHED,
    NUM_LAYERS,
    PREFILL,
    Runner,
    assert_same_seeds,
    run_both,
)

pytestmark = pytest.mark.gpu

capture_styles = pytest.mark.parametrize("style", CAPTURE_STYLES)


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


def captured_then_replayed(style: str, calls: int | None = None):
    """A warm-up, a capture in `style`, three replays and an eager forward."""

    def script(runner: Runner) -> list[torch.Tensor]:
        records = [runner.decode()]  # warm-up, as vLLM does before capture
        captured = runner.capture(runner.new_record(calls), style, calls)
        records += [runner.replay(captured) for _ in range(3)]
        return [*records, runner.decode()]

    return script


@capture_styles
def test_graph_capture_and_replays(make_runner, style: str) -> None:
    stock, ours = run_both(captured_then_replayed(style), make_runner)
    assert_same_seeds(stock, ours)
    replays = [tuple(record.tolist()) for record in ours[1:4]]
    assert len(set(replays)) == 3, "each replay draws fresh seeds"


@capture_styles
def test_graph_calls_beyond_n_draw_inline_in_the_graph(make_runner, style: str) -> None:
    """The calls past N draw inside the graph, as stock's: each replay's in-graph draws
    read the offset its seeds' draws left."""
    assert_same_seeds(*run_both(captured_then_replayed(style, NUM_LAYERS + 3), make_runner))


@capture_styles
def test_eager_forwards_and_graphs_of_several_batch_sizes_sharing_a_pool(
    make_runner, style: str
) -> None:
    def script(runner: Runner) -> list[torch.Tensor]:
        pool = torch.cuda.graph_pool_handle()
        graphs = {}
        for batch_size in (4, 2, 1):  # vLLM captures the largest first
            # Each graph keeps its own static input, as vLLM's padded batches do.
            activations = torch.ones(batch_size, 1 << 14, device=runner.device)
            runner.activations = activations
            graphs[batch_size] = (
                runner.capture(runner.new_record(), style, pool=pool),
                activations,
            )
        runner.activations = torch.ones(3, 1 << 14, device=runner.device)
        records = []
        for step in (None, 1, None, 4, 2, 1, "prefill", 2, None, 4):
            if step is None:
                records.append(runner.decode())
            elif step == "prefill":
                with runner.forward(PREFILL):
                    pass
            else:
                records.append(runner.replay(graphs[step][0]))
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


@pytest.fixture
def warnings(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, ...]]:
    """The arguments of each `logger.warning_once` call of the reset design."""
    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(prefetch_module.logger, "warning_once", lambda *args: calls.append(args))
    return calls


@pytest.mark.parametrize("consumed", [0, 1, NUM_LAYERS - 1])
def test_reset_eager_forward_that_leaves_seeds_warns(
    drawer: str, consumed: int, warnings: list[tuple[object, ...]]
) -> None:
    runner = Runner("reset", drawer=drawer)
    runner.decode(consumed)
    assert [args[2:] for args in warnings] == [("", NUM_LAYERS)]


@capture_styles
def test_reset_capture_that_leaves_seeds_warns_and_captures(
    drawer: str, style: str, warnings: list[tuple[object, ...]]
) -> None:
    """A performance option never stops an engine: the capture ends cleanly."""
    runner = Runner("reset", drawer=drawer)
    runner.decode()
    captured = runner.capture(runner.new_record(1), style, calls=1)
    runner.replay(captured)
    torch.cuda.synchronize()  # the capture ended cleanly: the device is fine
    assert [args[2:] for args in warnings] == [("captured ", NUM_LAYERS)]


# The checks at a forward's first and last seed (runner_hooks/core/prefetch.py's
# SeedBatch): each guarantee below raises AssertionError where it is broken, and
# test_each_guarantees_test_fails_with_the_checks_at_the_first_seed_only shows
# that those about a forward's later seeds are kept by the check at its last.


def refuses_a_later_capture_the_last_seed(runner: Runner) -> None:
    """Seeds drawn for an eager forward are not read inside a capture it enters
    after its first seed: the capture draws inline instead, as stock's."""
    graph = torch.cuda.CUDAGraph()
    record = runner.new_record()
    with runner.forward(DECODE):
        runner.layers(record, NUM_LAYERS - 1)
        with torch.cuda.graph(graph):
            last = runner.prefetcher.next_seed()
            record[-1:].copy_(
                torch.randint(0, 2**32, (1,), device=runner.device) if last is None else last
            )
    graph.replay()
    torch.cuda.synchronize()
    assert last is None, "a capture begun after the forward's first seed read its last seed"


def refuses_the_last_seed_after_the_capture(runner: Runner) -> None:
    """A forward whose first seed a capture took is not handed its last seed
    outside that capture: the eager consumer draws inline instead."""
    graph = torch.cuda.CUDAGraph()
    record = runner.new_record()
    with runner.forward(DECODE):
        with torch.cuda.graph(graph):
            runner.layers(record, NUM_LAYERS - 1)
        last = runner.prefetcher.next_seed()
    graph.replay()
    torch.cuda.synchronize()
    assert last is None, "an eager consumer read the last seed of a captured forward"


def draws_a_moved_forward_inline_as_stock(moved_after: int, runner: Runner) -> None:
    """A forward whose SSU calls move to another stream than its draws', at its first
    seed or after it, hands its later seeds to inline draws there (they are not ordered
    after its draws): stock's values, and the generator where stock's leave it."""
    record, side = runner.new_record(), torch.cuda.Stream()
    before = torch.cuda.get_rng_state()
    with runner.forward(DECODE):
        runner.layers(record, moved_after)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            later = record[moved_after:]
            runner.layers(later, len(later) - 1)
            last = runner.prefetcher.next_seed()
            later[-1:].copy_(
                torch.randint(0, 2**32, (1,), device=runner.device) if last is None else last
            )
        torch.cuda.current_stream().wait_stream(side)
    after = torch.cuda.get_rng_state()
    torch.cuda.set_rng_state(before)
    stock = torch.cat(
        [torch.randint(0, 2**32, (1,), device=runner.device) for _ in range(len(record))]
    )
    assert last is None, f"a seed was handed out on another stream (moved after {moved_after})"
    assert torch.equal(record, stock), "not stock's values"
    assert torch.equal(torch.cuda.get_rng_state(), after), "the generator is not where stock's is"


GUARANTEES = {
    "last_seed_refused_to_a_later_capture": refuses_a_later_capture_the_last_seed,
    "last_seed_refused_after_the_capture": refuses_the_last_seed_after_the_capture,
    "wrong_stream_at_the_first_seed": partial(draws_a_moved_forward_inline_as_stock, 0),
    "wrong_stream_after_the_first_seed": partial(draws_a_moved_forward_inline_as_stock, 1),
}
KEPT_BY_THE_LAST_SEED = (
    "last_seed_refused_to_a_later_capture",
    "last_seed_refused_after_the_capture",
    "wrong_stream_after_the_first_seed",
)


@pytest.mark.parametrize("guarantee", sorted(GUARANTEES))
def test_each_guarantee_holds(drawer: str, guarantee: str) -> None:
    runner = Runner("reset", drawer=drawer)
    runner.decode()
    GUARANTEES[guarantee](runner)


def take_checked_at_the_first_seed_only(self: prefetch_module.SeedBatch) -> torch.Tensor | None:
    """SeedBatch.take without the check at the last seed: the control's bug."""
    k = self.consumed
    if k > self._last:
        return None
    if k == 0 and not self._checked(k):
        return None
    self.consumed = k + 1
    return self._seeds[k]


@pytest.mark.parametrize("guarantee", KEPT_BY_THE_LAST_SEED)
def test_each_guarantees_test_fails_with_the_checks_at_the_first_seed_only(
    guarantee: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: without the check at the last seed, each test above of a forward
    that changed capture state or stream after its first seed fails."""
    monkeypatch.setattr(prefetch_module.SeedBatch, "take", take_checked_at_the_first_seed_only)
    runner = Runner("reset", drawer="randint")
    runner.decode()
    with pytest.raises(AssertionError):
        GUARANTEES[guarantee](runner)


class StreamThatSkipsWaits(torch.cuda.Stream):
    """A side stream that ignores the fork event: the race the fork prevents."""

    def wait_event(self, event: torch.cuda.Event) -> None:
        pass


def test_the_stress_test_catches_draws_that_skip_the_fork() -> None:
    """Proves the slow-consumer test can fail: without the fork, the side stream's
    draws (the forward-context design's) overrun readers."""

    def make(which: str | None) -> Runner:
        runner = Runner("forward-context" if which else None, "single", "randint")
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
        runner = Runner("reset" if which else None, drawer="randint")
        if which:
            runner.prefetcher.prefetch._handover = NoHandover()  # type: ignore[union-attr]
        return runner

    with pytest.raises(AssertionError, match="record"):
        assert_same_seeds(*run_both(alternating_streams, make))
