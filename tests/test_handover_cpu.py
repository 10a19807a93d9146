"""The eager buffer's handover between streams, with CUDA faked: which stream the
handover event is recorded on, and which streams the buffer is recorded for.

The legacy default stream's raw handle is 0; it must count as a stream like any
other, never as "no earlier forward".  On the GPU: tests/gpu/test_stream_handover.py.
"""

from __future__ import annotations

import pytest
import torch

from runner_hooks.core import prefetch as prefetch_module
from runner_hooks.forward_context.prefetcher import RandintDrawer

from .cuda_fakes import Cuda, FakeEvent, fake_cuda

DEFAULT = 0
"""cudaStreamLegacy, the legacy default stream's handle."""
POOL = 0x7F00


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> Cuda:
    """The current stream's handle, settable: streams.stream."""
    return fake_cuda(monkeypatch, Cuda(stream=DEFAULT))


def test_the_default_stream_hands_over_like_any_stream(streams: Cuda) -> None:
    prefetch = prefetch_module.SeedPrefetch("test", 4, torch.device("cpu"), RandintDrawer().draw)
    handover = prefetch._handover
    assert isinstance(handover, FakeEvent)
    for handle in (DEFAULT, POOL, POOL, DEFAULT, POOL):
        streams.stream = handle
        prefetch.finish(prefetch.schedule())
    # The first forward has no predecessor; then each change of stream records the
    # handover on the stream left, the default stream included.
    assert handover.recorded_on == [DEFAULT, POOL, DEFAULT]
    assert handover.waits == 3
    # The buffer is recorded for each stream that reads it, at each change.
    assert streams.recorded_for == [DEFAULT, POOL, DEFAULT, POOL]


def test_the_first_forward_on_a_pool_stream_needs_no_handover(streams: Cuda) -> None:
    streams.stream = POOL
    prefetch = prefetch_module.SeedPrefetch("test", 4, torch.device("cpu"), RandintDrawer().draw)
    assert prefetch._hand_over() is None
    assert prefetch._hand_over() is None, "the same stream: stream order suffices"
    streams.stream = DEFAULT
    assert prefetch._hand_over() is prefetch._handover
