"""One forward's seeds, drawn up front and consumed by index.

`SeedPrefetch` is the machinery both designs share: it knows how to schedule a
forward's N seeds (its drawer says how they are produced, its sync plan where
consumers wait) and how the k-th consumer takes seed k.  *When* a forward
begins is the designs' business (designs.py).

Why it is race-free
-------------------
Ordering uses CUDA events only: no polling, no timing assumption.  Under
CUDA-graph capture the same records and waits become graph edges.

* Seed values before their readers.  The side stream first waits on a fork
  event recorded on the forward's stream, so it starts after everything the
  forward's stream had enqueued.  The drawer writes seeds [start, stop) of a
  segment and the segment's event is recorded after them; the k-th consumer
  makes the forward's stream wait on the event of the segment holding seed k
  before it enqueues the SSU kernel that reads the seed.  Events of one batch
  are recorded in order on one stream, so waiting on a later one covers every
  earlier one, and each is waited on at most once.  A plan without a side
  stream draws on the forward's stream itself as the forward begins, so plain
  stream order puts every draw before every consumer, with no event at all.

* Seed buffers and their readers.  Eager forwards reuse one buffer owned by
  the prefetcher, and a forward's consumers run on the stream it began on
  (`take` refuses any other).  The next eager forward's draws must not write
  the buffer before the previous forward's consumers have read it, with the
  host free to run ahead of the GPU and no host synchronize:
  - on the same stream as the previous eager forward, stream order does it:
    the draws come after that forward's consumers were enqueued there (a plan
    without a side stream draws on that stream; a side stream first waits on
    the fork event, recorded on it after them);
  - on another stream (vLLM's V2 runner warms up and captures on one stream
    and serves on another; nothing promises one stream for all forwards), a
    handover event is recorded on the previous forward's stream as the new
    forward schedules: everything that forward enqueued, its consumers
    included, precedes the record, and the draws wait on it.  Its cost, a
    record and a wait, is paid only when the stream changes; otherwise it is
    one comparison of stream handles.
  A forward that left seeds unconsumed is joined at its end (`finish`), so no
  side-stream write of it is left running under later work on the forward's
  stream.  A forward
  captured in a CUDA graph draws into a buffer allocated during that capture,
  in the graph's memory pool: replays never share it with eager forwards,
  and graphs that share the pool replay one after another on one stream.

* Values.  A drawer advances the device's default generator exactly as the
  stock `torch.randint` calls would, in the same order, and the model runs no
  other generator user between the Mamba layers of a forward (assumed, not
  enforced; `check_offsets=True` checks it: offset_check.py), so seed k is
  the stock k-th draw, eagerly and on every replay (a graph replays its RNG
  at fresh offsets, as stock's captured randint does).  Calls beyond N get
  None and draw inline after the N prefetched ones: stock order again.

* Capture.  Every event of a captured batch is waited on by the time all N
  seeds are consumed, so the side stream is joined before the capture ends.
  A captured forward that consumed fewer is an error, raised by `finish`;
  when the forward ends inside the capture, `finish` first joins the side
  stream, so the capture ends cleanly and the error is ours rather than
  CUDA's "unjoined" one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .drawers import SeedDrawer
from .offset_check import GeneratorOffsetCheck
from .sync import SyncPlan

logger = logging.getLogger(__name__)

_is_capturing = torch._C._cuda_isCurrentStreamCapturing
"""torch.cuda.is_current_stream_capturing without its Python frame: checked on
every SSU call."""
_current_stream_handle = getattr(torch._C, "_cuda_getCurrentRawStream", None)
"""The current stream's cudaStream_t without building a Stream object (~0.1 us
against ~3 us for torch.cuda.current_stream on an H200 host), for the check on
every SSU call.  Private, but the call Inductor's generated code makes; absent
from CPU-only builds of torch, which never make a SeedBatch."""


class IncompleteSeedBatchError(RuntimeError):
    """A forward captured in a CUDA graph consumed fewer seeds than it drew."""


class WrongStreamError(RuntimeError):
    """A seed was taken on another stream than the one its forward began on."""


@dataclass(frozen=True, eq=False)
class SeedBuffer:
    """Storage for one batch of seeds, with the views and events used on the hot path.

    Built once for all eager forwards and once per capture, so that a forward
    only indexes prebuilt views instead of slicing tensors on the host.
    """

    whole: torch.Tensor
    segments: tuple[torch.Tensor, ...]
    """The drawer's output ranges, one per sync-plan segment."""
    seeds: tuple[torch.Tensor, ...]
    """One-element views handed to the SSU, one per seed."""
    events: tuple[torch.cuda.Event, ...]
    """One per segment, recorded after it; none when seeds are drawn on the
    consumers' stream."""
    wait_before: tuple[torch.cuda.Event | None, ...]
    """Per seed, the event its consumer waits on: its segment's event for the
    first seed of a segment, else None (seeds are taken in order, so that
    wait already covers the rest of the segment)."""
    last_segment_start: int
    """Once the seed at this index is taken, every event has been waited on."""


class SeedBatch:
    """The seeds of one forward, handed out in order by `take`."""

    __slots__ = (
        "_buffer",
        "_device_index",
        "_owner",
        "_stream_handle",
        "consumed",
        "stream",
        "under_capture",
    )

    def __init__(
        self,
        owner: str,
        buffer: SeedBuffer,
        device_index: int,
        stream: torch.cuda.Stream | None,
        under_capture: bool,
    ) -> None:
        self._owner = owner
        self._buffer = buffer
        self._device_index = device_index
        self._stream_handle = _current_stream_handle(device_index)  # type: ignore[misc]
        # The forward's stream, kept where events need it (side-stream plans).
        self.stream = stream
        self.under_capture = under_capture
        self.consumed = 0

    def take(self) -> torch.Tensor | None:
        """The next seed, once the current stream may read it (the hot path).

        None, so the caller draws inline as stock, beyond the batch's size and
        when the capture state differs from the batch's: a graph must not read
        seeds drawn outside it, nor an eager call seeds that only a graph writes.
        Raises WrongStreamError on another stream than the forward's: the
        ordering argument above holds for the forward's own stream only.
        """
        k = self.consumed
        buffer = self._buffer
        if k >= len(buffer.seeds) or _is_capturing() != self.under_capture:
            return None
        if _current_stream_handle(self._device_index) != self._stream_handle:  # type: ignore[misc]
            raise WrongStreamError(
                f"{self._owner}: seed {k} taken on {torch.cuda.current_stream()}, "
                "but its forward began on the stream with handle "
                f"{self._stream_handle:#x}; all SSU calls of a forward must run on "
                "the stream that was current when it began"
            )
        event = buffer.wait_before[k]
        if event is not None:
            self.stream.wait_event(event)  # type: ignore[union-attr]
        self.consumed = k + 1
        return buffer.seeds[k]

    @property
    def complete(self) -> bool:
        return self.consumed == len(self._buffer.seeds)

    def join(self) -> None:
        """Makes the forward's stream wait for every draw, if no consumer did."""
        buffer = self._buffer
        if buffer.events and self.consumed <= buffer.last_segment_start:
            self.stream.wait_event(buffer.events[-1])  # type: ignore[union-attr]


class CheckedSeedBatch(SeedBatch):
    """An eager forward's batch under the opt-in offset check (offset_check.py):
    at every seed taken, the generator must be where the draws left it."""

    __slots__ = ("_check", "_expected")

    def __init__(self, check: GeneratorOffsetCheck, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self._check = check
        self._expected = check.offset()

    def take(self) -> torch.Tensor | None:
        seed = super().take()
        if seed is not None:
            self._expected = self._check.verify(self._expected, self.consumed - 1)
        return seed


class SeedPrefetch:
    """Schedules and closes per-forward seed batches for one device."""

    def __init__(
        self,
        owner: str,
        num_seeds: int,
        device: torch.device,
        drawer: SeedDrawer,
        plan: SyncPlan,
        check_offsets: bool = False,
    ) -> None:
        self.owner = owner
        self.num_seeds = num_seeds
        self.device = device
        self._device_index = device.index
        self.drawer = drawer
        self.plan = plan
        self._segments = plan.segments(num_seeds)
        self._side_stream = torch.cuda.Stream(device) if plan.side_stream else None
        self._fork = torch.cuda.Event()
        self._eager_buffer = self._new_buffer()
        # The stream of the last eager forward (its handle; 0 before the
        # first), whose consumers may still be reading the eager buffer.
        self._eager_stream = 0
        self._handover = torch.cuda.Event()
        self._warned_unconsumed = False
        self.offset_check = (
            GeneratorOffsetCheck(owner, device.index) if check_offsets else None
        )

    def _new_buffer(self) -> SeedBuffer:
        whole = torch.empty(self.num_seeds, dtype=torch.int64, device=self.device)
        events = (
            tuple(torch.cuda.Event() for _ in self._segments)
            if self._side_stream
            else ()
        )
        first_of_segment = {
            start: index for index, (start, _) in enumerate(self._segments)
        }
        return SeedBuffer(
            whole,
            segments=tuple(whole[start:stop] for start, stop in self._segments),
            seeds=whole.split(1),
            events=events,
            wait_before=tuple(
                events[first_of_segment[k]]
                if events and k in first_of_segment
                else None
                for k in range(self.num_seeds)
            ),
            last_segment_start=self._segments[-1][0],
        )

    def schedule(self) -> SeedBatch:
        """Enqueues the draws of one forward's N seeds; returns their batch.

        Without a side stream the draws go on the current stream ahead of every
        consumer, and no Stream object is built: only events need one.
        """
        under_capture = _is_capturing()
        handover = False
        if under_capture:
            buffer = self._new_buffer()
        else:
            buffer = self._eager_buffer
            previous = self._eager_stream
            self._eager_stream = _current_stream_handle(self._device_index)  # type: ignore[misc]
            if previous and previous != self._eager_stream:
                self._handover.record(torch.cuda.ExternalStream(previous, self.device))
                handover = True
        side_stream = self._side_stream
        if side_stream is None:
            if handover:
                torch.cuda.current_stream(self._device_index).wait_event(self._handover)
            self.drawer.draw(buffer.whole)
            return self._batch(buffer, None, under_capture)
        stream = torch.cuda.current_stream(self._device_index)
        self._fork.record(stream)
        side_stream.wait_event(self._fork)
        if handover:
            side_stream.wait_event(self._handover)
        with torch.cuda.stream(side_stream):
            for segment, event in zip(buffer.segments, buffer.events, strict=True):
                self.drawer.draw(segment)
                event.record(side_stream)
        return self._batch(buffer, stream, under_capture)

    def _batch(
        self,
        buffer: SeedBuffer,
        stream: torch.cuda.Stream | None,
        under_capture: bool,
    ) -> SeedBatch:
        """The batch of draws just enqueued; checked where the check is on, eagerly."""
        args = (self.owner, buffer, self._device_index, stream, under_capture)
        if self.offset_check is None or under_capture:
            return SeedBatch(*args)
        return CheckedSeedBatch(self.offset_check, *args)

    def finish(self, batch: SeedBatch) -> None:
        """Closes a forward: joins and reports a batch that was not fully consumed."""
        if batch.complete:
            return
        if not batch.under_capture or _is_capturing():
            batch.join()
        if batch.under_capture:
            raise IncompleteSeedBatchError(
                f"{self.owner}: a forward captured in a CUDA graph consumed "
                f"{batch.consumed} of the {self.num_seeds} seeds it prefetched; the "
                "graph would leave the generator past stock. Every forward that runs "
                f"the SSU must call it once per Mamba-2 layer ({self.num_seeds}), or "
                "tell the prefetcher runs_ssu=False."
            )
        if not self._warned_unconsumed:
            self._warned_unconsumed = True
            logger.warning(
                "%s: a forward consumed %d of the %d seeds it prefetched; the CUDA "
                "generator is now past where stock would leave it, so later seeds "
                "differ from stock. (warned once)",
                self.owner,
                batch.consumed,
                self.num_seeds,
            )
