"""Eager forwards on the legacy default stream and on pool streams, and a body's
exception under a capture the hooks enclose; and the eager buffer's lifetime when
its prefetcher is replaced.

The legacy default stream's raw handle is 0, and torch's pool streams are
non-blocking, so nothing but the handover orders a forward on one after a
forward on the other.  Each forward stalls its stream (torch.cuda._sleep) before
its consumers, a forward on the default stream four times as long as one on the
pool stream, so the next forward's draws would overrun unread seeds also where
they come after its own stall (the side-stream plans draw at the first SSU call).
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from bench.sync import SYNC_PLANS
from runner_hooks.core import prefetch as prefetch_module

from .harness import DECODE, NUM_LAYERS, Runner, assert_same_seeds, run_both
from .test_capture_failures import run_script

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
    previous = self._eager_stream_handle or 0
    self._eager_stream_handle = handle
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
    plan = "current_stream" if design == "reset" else "per_seed"

    def make(which: str | None) -> Runner:
        return Runner(design if which else None, plan, "randint")

    with (
        torch.cuda.stream(torch.cuda.default_stream()),
        pytest.raises(AssertionError, match="record"),
    ):
        assert_same_seeds(*run_both(default_then_pool_and_back, make))


CAPTURE_RAISES = textwrap.dedent(
    """
    import json, sys
    import torch
    from runner_hooks import hooks as base_hooks
    from tests.gpu.harness import FULL_GRAPH, Runner

    sync_plan, drawer, hooks = sys.argv[1], sys.argv[2], sys.argv[3]
    runner = Runner("reset", sync_plan, drawer)
    if hooks == "core":  # the hooks without that rule (vLLM has no side stream)
        runner.hooks = base_hooks.ForwardHooks()
        runner.hooks.register(runner.prefetcher)
    runner.decode()
    record = runner.new_record()
    try:
        # V1: CUDAGraphWrapper's torch.cuda.graph runs inside the runner's hooks.
        with runner.forward(FULL_GRAPH), torch.cuda.graph(torch.cuda.CUDAGraph()):
            runner.layers(record, calls=1)
            raise KeyError("the body failed")
    except BaseException as error:
        print(json.dumps([type(error).__name__, str(error)]))
    """
)


@pytest.mark.parametrize("sync_plan", sorted(SYNC_PLANS))
def test_the_bodys_exception_under_a_capture_inside_the_hooks_propagates(
    sync_plan: str, drawer: str
) -> None:
    raised, stderr = run_script(CAPTURE_RAISES, sync_plan, drawer, "library")
    assert raised == ["KeyError", "'the body failed'"], stderr


def test_the_capture_test_fails_without_the_rule() -> None:
    """The control: with core's hooks and a side stream, CUDA's error replaces it."""
    # per_seed: after one SSU call, the events of the other seeds are not waited on,
    # so the side stream is not joined when the capture ends.
    raised, stderr = run_script(CAPTURE_RAISES, "per_seed", "randint", "core")
    assert isinstance(raised, list) and raised[0] != "KeyError", (raised, stderr)


def seeds_read_after_the_prefetcher_is_replaced(sync_plan: str, drawer: str) -> list[int]:
    """A forward on a pool stream reads its seeds after a stall; meanwhile the
    prefetcher is dropped (as a KV-cache init replaces it) and the default stream
    fills new tensors of the eager buffer's size with -1."""
    from bench.variants import BodyFirstForwardHooks, ResetPrefetcherByName

    device = torch.device("cuda", torch.cuda.current_device())
    out = torch.zeros(NUM_LAYERS, dtype=torch.int64, device=device)
    pool = torch.cuda.Stream()
    hooks = BodyFirstForwardHooks()
    prefetcher = ResetPrefetcherByName(NUM_LAYERS, device, sync_plan=sync_plan, drawer=drawer)
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


@pytest.mark.parametrize("sync_plan", sorted(SYNC_PLANS))
def test_the_eager_buffer_outlives_its_readers_when_replaced(sync_plan: str, drawer: str) -> None:
    with torch.cuda.stream(torch.cuda.default_stream()):
        state = torch.cuda.get_rng_state()
        read = seeds_read_after_the_prefetcher_is_replaced(sync_plan, drawer)
        assert read == stock_seeds_from(state)


def test_the_buffer_test_fails_without_record_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: untied from the pool stream, the freed buffer is reused at once."""
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    with torch.cuda.stream(torch.cuda.default_stream()):
        state = torch.cuda.get_rng_state()
        read = seeds_read_after_the_prefetcher_is_replaced("current_stream", "randint")
        assert read != stock_seeds_from(state)
        assert -1 in read
