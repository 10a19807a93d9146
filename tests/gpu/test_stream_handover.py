"""Eager forwards on the legacy default stream and on pool streams; and the seed
buffer's lifetime when its prefetcher is replaced.

The legacy default stream's raw handle is 0, and torch's pool streams are
non-blocking, so nothing but the handover orders a forward on one after a
forward on the other.  Each forward stalls its stream (torch.cuda._sleep) before
its consumers, a forward on the default stream four times as long as one on the
pool stream, so the next forward's draws would overrun unread seeds also where
they come after its own stall (the forward-context design's side-stream plans draw
at the first SSU call).
"""

from __future__ import annotations

import pytest
import torch

from runner_hooks.core import prefetch as prefetch_module

from .harness import DECODE, NUM_LAYERS, Runner, assert_same_seeds, run_both

pytestmark = pytest.mark.gpu

STALL = 2_000_000
"""GPU cycles each forward sleeps before its consumers (about a millisecond)."""


def default_then_pool_and_back(runner: Runner) -> list[torch.Tensor]:
    """Forwards on the legacy default stream, a pool stream, the default stream and
    the pool stream again, each with its consumers stalled (the default stream's
    longer)."""
    default, pool = torch.cuda.default_stream(), torch.cuda.Stream()
    assert default.cuda_stream == 0, "the legacy default stream has handle 0"
    records = [runner.new_record() for _ in range(4)]
    for stream, record in zip((default, pool, default, pool), records, strict=True):
        with torch.cuda.stream(stream), runner.forward(DECODE):
            torch.cuda._sleep(4 * STALL if stream is default else STALL)
            runner.layers(record)
    default.wait_stream(pool)
    return records


def test_forwards_on_the_default_stream_and_a_pool_stream(make_runner) -> None:
    with torch.cuda.stream(torch.cuda.default_stream()):
        assert_same_seeds(*run_both(default_then_pool_and_back, make_runner))


def handle_zero_as_no_forward(self: prefetch_module.SeedPrefetch) -> torch.cuda.Event | None:
    """The handover with raw handle 0 taken for "no earlier forward": the control's bug."""
    handle = prefetch_module._current_stream_handle(self._device_index)  # type: ignore[misc]
    previous = self._stream_handle or 0
    self._stream_handle = handle
    if previous and previous != handle:
        self._handover.record(torch.cuda.ExternalStream(previous))
        return self._handover
    return None


@pytest.mark.parametrize("design", ["reset", "forward-context"])
def test_the_default_stream_test_fails_with_handle_zero_as_no_forward(
    design: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: with 0 meaning "none", the pool stream's draws overwrite seeds
    the default stream's stalled consumers have not read."""
    monkeypatch.setattr(prefetch_module.SeedPrefetch, "_hand_over", handle_zero_as_no_forward)
    plan = None if design == "reset" else "per_seed"

    def make(which: str | None) -> Runner:
        return Runner(design if which else None, plan, "randint")

    with (
        torch.cuda.stream(torch.cuda.default_stream()),
        pytest.raises(AssertionError, match="record"),
    ):
        assert_same_seeds(*run_both(default_then_pool_and_back, make))


def seeds_read_after_the_prefetcher_is_replaced(drawer: str) -> list[int]:
    """A forward of the reset design on a pool stream reads its seeds after a stall;
    meanwhile the prefetcher is dropped (as a KV-cache init replaces it) and the
    default stream fills new tensors of the seed buffer's size with -1."""
    from bench.variants import ResetPrefetcherByName
    from runner_hooks.hooks import ForwardHooks

    device = torch.device("cuda", torch.cuda.current_device())
    out = torch.zeros(NUM_LAYERS, dtype=torch.int64, device=device)
    pool = torch.cuda.Stream()
    hooks = ForwardHooks()
    prefetcher = ResetPrefetcherByName(NUM_LAYERS, device, drawer=drawer)
    handle = hooks.register(prefetcher)
    with torch.cuda.stream(pool), hooks.forward(DECODE):
        torch.cuda._sleep(64 * STALL)
        for k in range(NUM_LAYERS):
            seed = prefetcher.next_seed()
            assert seed is not None
            out[k : k + 1].copy_(seed)
    handle.remove()
    del prefetcher, handle, hooks, seed  # no cycle: freed here, while the pool stream sleeps
    junk = [torch.full((NUM_LAYERS,), -1, dtype=torch.int64, device=device) for _ in range(64)]
    torch.cuda.synchronize()
    del junk
    return out.tolist()


def stock_seeds_from(state: torch.Tensor) -> list[int]:
    torch.cuda.set_rng_state(state)
    return [int(torch.randint(0, 2**32, (1,), device="cuda")) for _ in range(NUM_LAYERS)]


def test_the_buffer_outlives_its_readers_when_replaced(drawer: str) -> None:
    with torch.cuda.stream(torch.cuda.default_stream()):
        state = torch.cuda.get_rng_state()
        read = seeds_read_after_the_prefetcher_is_replaced(drawer)
        assert read == stock_seeds_from(state)


def test_the_buffer_test_fails_without_record_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: untied from the pool stream, the freed buffer is reused at once."""
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    with torch.cuda.stream(torch.cuda.default_stream()):
        state = torch.cuda.get_rng_state()
        read = seeds_read_after_the_prefetcher_is_replaced("randint")
        assert read != stock_seeds_from(state)
        assert -1 in read
