"""The eager buffer's handover between streams, with CUDA faked: which stream the
handover event is recorded on, and which streams the buffer is recorded for.

The legacy default stream's raw handle is 0; it must count as a stream like any
other, never as "no earlier forward".  On the GPU: tests/gpu/test_stream_handover.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from runner_hooks.core import prefetch as prefetch_module
from runner_hooks.forward_context.prefetcher import RandintDrawer

DEFAULT = 0
"""cudaStreamLegacy, the legacy default stream's handle."""
POOL = 0x7F00


@dataclass(frozen=True)
class FakeStream:
    cuda_stream: int


class FakeEvent:
    def __init__(self) -> None:
        self.recorded_on: list[int] = []
        self.waits = 0

    def record(self, stream: FakeStream) -> None:
        self.recorded_on.append(stream.cuda_stream)

    def wait(self, stream: object = None) -> None:
        self.waits += 1


RECORDED_FOR: list[int] = []
"""The streams record_stream was called with, in order."""


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The current stream's handle, settable: streams[0]."""
    current = [DEFAULT]
    RECORDED_FOR.clear()
    monkeypatch.setattr(
        torch.Tensor, "record_stream", lambda self, stream: RECORDED_FOR.append(stream.cuda_stream)
    )
    monkeypatch.setattr(prefetch_module, "_current_stream_handle", lambda index: current[0])
    monkeypatch.setattr(prefetch_module, "_is_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: FakeStream(current[0]))
    return current


def test_the_default_stream_hands_over_like_any_stream(streams: list[int]) -> None:
    prefetch = prefetch_module.SeedPrefetch("test", 4, torch.device("cpu"), RandintDrawer().draw)
    handover = prefetch._handover
    assert isinstance(handover, FakeEvent)
    for handle in (DEFAULT, POOL, POOL, DEFAULT, POOL):
        streams[0] = handle
        prefetch.finish(prefetch.schedule())
    # The first forward has no predecessor; then each change of stream records the
    # handover on the stream left, the default stream included.
    assert handover.recorded_on == [DEFAULT, POOL, DEFAULT]
    assert handover.waits == 3
    # The buffer is recorded for each stream that reads it, at each change.
    assert RECORDED_FOR == [DEFAULT, POOL, DEFAULT, POOL]


def test_the_first_forward_on_a_pool_stream_needs_no_handover(streams: list[int]) -> None:
    streams[0] = POOL
    prefetch = prefetch_module.SeedPrefetch("test", 4, torch.device("cpu"), RandintDrawer().draw)
    assert prefetch._hand_over() is None
    assert prefetch._hand_over() is None, "the same stream: stream order suffices"
    streams[0] = DEFAULT
    assert prefetch._hand_over() is prefetch._handover
