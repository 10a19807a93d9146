# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Seeds drawn on a side stream and published to their consumers by events.

Race freedom, beyond the shared machinery's (prefetch.py):

* Seeds before their readers. The side stream first waits on a fork event
  recorded on the forward's stream, then on the eager buffer's handover event
  where the stream changed (the previous stream may be the legacy default
  stream: see prefetch.py). A plan's segments are drawn in order, each
  followed by its event; the first consumer of a segment makes the forward's
  stream wait on that event, which covers every earlier segment too.
* The buffers. The eager buffer is also `record_stream`ed on the side
  stream, which writes it. A forward that left seeds unconsumed is joined at
  its end, so no draw of it is left running under later work.
* Capture. Consuming all N seeds waits on every event, joining the side
  stream before the capture ends. A captured forward that ends early inside
  its capture is joined first, so the capture ends cleanly; one whose capture
  ended first (an exception of the body under torch.cuda.graph) raises
  UnjoinedCaptureError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core.prefetch import SeedBatch, SeedBuffer, SeedPrefetch, _is_capturing


class UnjoinedCaptureError(RuntimeError):
    """A capture ended before the side stream of its seed draws was joined."""


@dataclass(frozen=True)
class SyncPlan:
    """How a batch of seeds is published.

    event_after: for N seeds, the ascending indices after which an event is
        recorded; the last is N - 1.
    """

    name: str
    event_after: Callable[[int], tuple[int, ...]]

    def segments(self, num_seeds: int) -> tuple[tuple[int, int], ...]:
        """The [start, stop) seed ranges that end at an event, in order."""
        if num_seeds < 1:
            raise ValueError(f"a seed batch holds at least one seed, got {num_seeds}")
        ends = self.event_after(num_seeds)
        if not ends or ends[-1] != num_seeds - 1 or list(ends) != sorted(set(ends)):
            raise ValueError(
                f"sync plan {self.name!r} gave {ends} for {num_seeds} seeds"
            )
        starts = (0, *(end + 1 for end in ends[:-1]))
        return tuple((start, end + 1) for start, end in zip(starts, ends, strict=True))


PER_SEED = SyncPlan("per_seed", lambda n: tuple(range(n)))
"""One event per seed."""


@dataclass(frozen=True, eq=False)
class SideStreamBuffer(SeedBuffer):
    segments: tuple[torch.Tensor, ...]
    events: tuple[torch.Event, ...]
    wait_before: tuple[torch.Event | None, ...]
    """Per seed, its segment's event if it is the segment's first seed."""
    last_segment_start: int


class SideStreamSeedBatch(SeedBatch):
    __slots__ = ("_buffer", "stream")

    def __init__(
        self,
        hand_back: Callable[[SeedBatch, int], None],
        buffer: SideStreamBuffer,
        device_index: int,
        under_capture: bool,
        stream: torch.cuda.Stream,
    ) -> None:
        eager_draws = 0 if under_capture else len(buffer.seeds)
        super().__init__(
            hand_back, buffer.seeds, device_index, eager_draws, under_capture
        )
        self._buffer = buffer
        self.stream = stream

    def take(self) -> torch.Tensor | None:
        seed = super().take()
        if seed is not None:
            event = self._buffer.wait_before[self.consumed - 1]
            if event is not None:
                self.stream.wait_event(event)
        return seed

    @property
    def joined(self) -> bool:
        return self.consumed > self._buffer.last_segment_start

    def join(self) -> None:
        """Makes the forward's stream wait for every draw, if no consumer did."""
        if not self.joined:
            self.stream.wait_event(self._buffer.events[-1])


class SideStreamSeedPrefetch(SeedPrefetch):
    """Draws each forward's seeds on a side stream, segment by segment."""

    def __init__(
        self,
        owner: str,
        num_seeds: int,
        device: torch.device,
        draw: Callable[[torch.Tensor], None],
        plan: SyncPlan,
    ) -> None:
        self.plan = plan
        self._segments = plan.segments(num_seeds)
        self._side_stream = torch.cuda.Stream(device)
        self._fork = torch.Event()
        super().__init__(owner, num_seeds, device, draw)
        self._buffer.whole.record_stream(self._side_stream)

    def _new_buffer(self) -> SideStreamBuffer:
        whole = torch.empty(self.num_seeds, dtype=torch.int64, device=self.device)
        events = tuple(torch.Event() for _ in self._segments)
        first = {start: events[i] for i, (start, _) in enumerate(self._segments)}
        return SideStreamBuffer(
            whole,
            whole.split(1),
            segments=tuple(whole[start:stop] for start, stop in self._segments),
            events=events,
            wait_before=tuple(first.get(k) for k in range(self.num_seeds)),
            last_segment_start=self._segments[-1][0],
        )

    def schedule(self) -> SeedBatch:
        """The batch of a forward beginning now, drawn on the side stream into
        the eager buffer, or, inside a capture, into a buffer of the graph's pool
        (no forward runs before a replay to draw for it)."""
        if _is_capturing():
            return self._draw(self._new_buffer(), None, True)
        return self._draw(self._buffer, self._hand_over(), False)

    def _draw(
        self,
        buffer: SeedBuffer,
        handover: torch.Event | None,
        under_capture: bool,
    ) -> SeedBatch:
        assert isinstance(buffer, SideStreamBuffer)
        stream = torch.cuda.current_stream(self._device_index)
        side_stream = self._side_stream
        self._fork.record(stream)
        side_stream.wait_event(self._fork)
        if handover is not None:
            side_stream.wait_event(handover)
        with torch.cuda.stream(side_stream):
            for segment, event in zip(buffer.segments, buffer.events, strict=True):
                self.draw(segment)
                event.record(side_stream)
        return SideStreamSeedBatch(
            self._hand_back, buffer, self._device_index, under_capture, stream
        )

    def finish(self, batch: SeedBatch, full_cudagraph: bool = False) -> None:
        assert isinstance(batch, SideStreamSeedBatch)
        if not batch.complete and not batch.joined:
            if not batch.under_capture or _is_capturing():
                batch.join()
            else:
                raise UnjoinedCaptureError(
                    f"{self.owner}: a capture ended, its forward having consumed "
                    f"{batch.consumed} of the {self.num_seeds} seeds it drew, "
                    "before the side stream of their draws was joined"
                )
        super().finish(batch, full_cudagraph)
