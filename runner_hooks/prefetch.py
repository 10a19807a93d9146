"""One forward's seeds, drawn up front on a side stream and consumed by index.

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
  earlier one, and each is waited on at most once.

* Seed buffers and their readers.  Eager forwards reuse one buffer owned by
  the prefetcher.  The next eager forward's draws write it only after that
  forward's fork event, which its stream records after every consumer of the
  previous forward was enqueued on that same stream (consumers run on the
  stream the forward began on; `take` refuses any other).  A forward that left
  seeds unconsumed is joined at its end (`finish`), so no side-stream write of
  it is left running under later work on the forward's stream.  A forward
  captured in a CUDA graph draws into a buffer allocated during that capture,
  in the graph's memory pool: replays never share it with eager forwards,
  and graphs that share the pool replay one after another on one stream.

* Values.  A drawer advances the device's default generator exactly as the
  stock `torch.randint` calls would, in the same order, and the model runs no
  other generator user between the Mamba layers of a forward, so seed k is
  the stock k-th draw, eagerly and on every replay (a graph replays its RNG
  at fresh offsets, as stock's captured randint does).  Calls beyond N get
  None and draw inline after the N prefetched ones: stock order again.

* Capture.  Every event of a captured batch is waited on by the time all N
  seeds are consumed, so the side stream is joined before the capture ends.
  A captured forward that consumed fewer is an error, raised by `finish`
  after it joins the side stream, so the capture ends cleanly and the error
  is ours rather than CUDA's "unjoined" one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .drawers import SeedDrawer
from .sync import SyncPlan

logger = logging.getLogger(__name__)

_is_capturing = torch.cuda.is_current_stream_capturing


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
    """One per segment; none when seeds are drawn on the consumers' stream."""


@dataclass(eq=False)
class SeedBatch:
    """The seeds of one forward and how far its consumers have got."""

    buffer: SeedBuffer
    stream: torch.cuda.Stream
    under_capture: bool
    consumed: int = 0
    events_waited: int = 0


class SeedPrefetch:
    """Schedules, hands out and closes per-forward seed batches for one device."""

    def __init__(
        self, owner: str, num_seeds: int, device: torch.device, drawer: SeedDrawer, plan: SyncPlan
    ) -> None:
        self.owner = owner
        self.num_seeds = num_seeds
        self.device = device
        self.drawer = drawer
        self.plan = plan
        self._segments = plan.segments(num_seeds)
        self._event_of_seed = tuple(
            index for index, (start, stop) in enumerate(self._segments) for _ in range(start, stop)
        )
        self._side_stream = torch.cuda.Stream(device) if plan.side_stream else None
        self._fork = torch.cuda.Event()
        self._eager_buffer = self._new_buffer()
        self._warned_unconsumed = False

    def _new_buffer(self) -> SeedBuffer:
        whole = torch.empty(self.num_seeds, dtype=torch.int64, device=self.device)
        return SeedBuffer(
            whole,
            tuple(whole[start:stop] for start, stop in self._segments),
            whole.split(1),
            tuple(torch.cuda.Event() for _ in self._segments) if self._side_stream else (),
        )

    def schedule(self) -> SeedBatch:
        """Enqueues the draws of one forward's N seeds; returns their batch."""
        stream = torch.cuda.current_stream(self.device)
        under_capture = _is_capturing()
        buffer = self._new_buffer() if under_capture else self._eager_buffer
        side_stream = self._side_stream
        if side_stream is None:
            self.drawer.draw(buffer.whole)
        else:
            self._fork.record(stream)
            side_stream.wait_event(self._fork)
            with torch.cuda.stream(side_stream):
                for segment, event in zip(buffer.segments, buffer.events, strict=True):
                    self.drawer.draw(segment)
                    event.record(side_stream)
        return SeedBatch(buffer, stream, under_capture)

    def take(self, batch: SeedBatch) -> torch.Tensor | None:
        """The next seed of `batch`, once the current stream may read it.

        None, so the caller draws inline as stock, beyond N and when the
        capture state differs from the batch's: a graph must not read seeds
        drawn outside it, nor an eager call seeds that only a graph writes.
        """
        k = batch.consumed
        if k >= self.num_seeds or _is_capturing() != batch.under_capture:
            return None
        events = batch.buffer.events
        event_index = self._event_of_seed[k]
        if events and event_index >= batch.events_waited:
            stream = torch.cuda.current_stream(self.device)
            if stream != batch.stream:
                raise WrongStreamError(
                    f"{self.owner}: seed {k} taken on {stream}, but its forward began on "
                    f"{batch.stream}; all SSU calls of a forward must run on the stream "
                    "that was current when the forward began"
                )
            stream.wait_event(events[event_index])
            batch.events_waited = event_index + 1
        batch.consumed = k + 1
        return batch.buffer.seeds[k]

    def finish(self, batch: SeedBatch) -> None:
        """Closes a forward: joins and reports a batch that was not fully consumed."""
        consumed = batch.consumed
        if consumed == self.num_seeds:
            return
        events = batch.buffer.events
        if batch.events_waited < len(events) and (not batch.under_capture or _is_capturing()):
            batch.stream.wait_event(events[-1])
        if batch.under_capture:
            raise IncompleteSeedBatchError(
                f"{self.owner}: a forward captured in a CUDA graph consumed {consumed} of the "
                f"{self.num_seeds} seeds it prefetched; the graph would leave the generator "
                "past stock. Every forward that runs the SSU must call it once per Mamba-2 "
                f"layer ({self.num_seeds}), or tell the prefetcher runs_ssu=False."
            )
        if not self._warned_unconsumed:
            self._warned_unconsumed = True
            logger.warning(
                "%s: a forward consumed %d of the %d seeds it prefetched; the CUDA generator "
                "is now past where stock would leave it, so later seeds differ from stock. "
                "(warned once)",
                self.owner,
                consumed,
                self.num_seeds,
            )
