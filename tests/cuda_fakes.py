"""CUDA stand-ins for the prefetch machinery's CPU tests: streams by raw handle, events
that record where they were recorded and how often waited on, the capture state, and
the streams a buffer was `record_stream`ed for."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from runner_hooks.core import prefetch as prefetch_module


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


@dataclass
class Cuda:
    """What the faked CUDA reports: the current stream's handle, whether it captures,
    and the streams record_stream was called with, in order."""

    stream: int = 1
    capturing: bool = False
    recorded_for: list[int] = field(default_factory=list)


def fake_cuda(monkeypatch: pytest.MonkeyPatch, state: Cuda) -> Cuda:
    monkeypatch.setattr(
        torch.Tensor,
        "record_stream",
        lambda self, stream: state.recorded_for.append(stream.cuda_stream),
    )
    monkeypatch.setattr(prefetch_module, "_current_stream_handle", lambda index: state.stream)
    monkeypatch.setattr(prefetch_module, "_is_capturing", lambda: state.capturing)
    monkeypatch.setattr(torch, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: FakeStream(state.stream))
    return state
