"""The reset design with no RNG inside any graph: each forward's N seeds are drawn
eagerly as its hook fires, before a capture and before a replay alike, into one
persistent buffer that every captured graph reads.

Identity with stock, value by value and in the generator's advance (torch's
CUDAGeneratorImpl: a draw of numel 1 reserves 4 Philox offsets; under capture it
reserves them in the graph, `offset_intragraph`, and leaves the generator's offset
`o` alone; each replay of a graph that drew W offsets reads `o` as its base and
advances the generator by W; a graph that drew nothing skips that prologue):

- Eager forward: the drawer fills the buffer with the N values stock's N draws
  would give from `o`, advancing `o` by 4N, as they would.
- Replay: stock's graph reads `o` and advances it by 4N; here the replay's hook
  draws from `o` first (advancing by 4N) and the graph, which draws nothing,
  reads those values from the buffer. The same values, the same advance.
- Capture with the hook outside it (V1: the wrapper captures inside the runner's
  hook): the hook cannot tell a capture from a replay, so it draws (+4N). Stock's
  capture advances nothing; so when the forward's first seed is taken under
  capture, the forward is marked captured, and as it ends (outside the capture)
  the generator is put back by 4N: `rewind_generator`. Nothing else moves the
  generator's offset while a capture is open (every draw in it is intragraph).
- Capture with the hook inside it (V2: forward_fn opens the hook inside
  torch.cuda.graph): nothing is drawn; the graph reads the buffer, whose values
  then are irrelevant (a capture executes nothing). Stock's advance: none.
- Seeds past N under capture are drawn inline, inside the graph, as stock's: that
  graph then draws, and its replay's prologue reads the offset the eager draw left,
  as stock's N+1-th draw would.

Race-freedom, by stream order and events only (the argument of
runner_hooks/core/prefetch.py, for one buffer shared by eager forwards and graphs):
every draw is enqueued on the forward's stream, and the forward's readers (its eager
SSU kernels or its replayed graph) are enqueued on that stream after it; the next
forward's draw is enqueued after them on the same stream, or, on another stream,
after waiting on the handover event recorded on the last stream (SeedPrefetch's
handover). The buffer lives as long as the process's prefetch machinery for its
device and size (`persistent_prefetch`), so a graph never outlives what it reads.

Which graphs need an in-graph draw: none. On V1 a replay's hook draws N whenever
the batch has decode tokens, which is what the graph's capture took when every FULL
graph is of a uniform batch (N SSU calls). In 0.20.0-0.33.0 every FULL graph of a
Mamba-2 hybrid is: Mamba's attention builder supports full graphs of uniform batches
only (UNIFORM_BATCH), so vLLM turns a FULL mode for mixed batches into
FULL_AND_PIECEWISE or FULL_DECODE_ONLY (bench/test_outside_graph.py checks both in
each release's source), and the builder counts each request of a uniform batch as a
decode (its decode threshold is at least 1 + the speculative tokens). V2's replay wrapper
(bench/engine/outside_graph_v2.py) draws exactly what each graph's capture took.
DBO micro-batches keep stock's inline draw, as in the default.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from runner_hooks.core import prefetch as core
from runner_hooks.core.prefetch import SeedPrefetch, WrongStreamError
from runner_hooks.hooks import ForwardInfo

logger = logging.getLogger(__name__)

OFFSETS_PER_DRAW = 4
"""Philox offsets one stock draw (randint of numel 1) reserves."""


class GeneratorRewindError(RuntimeError):
    """The generator cannot be put back after a capture as stock leaves it."""


def rewind_generator(device_index: int, offsets: int) -> None:
    """Moves the device's default CUDA generator back by `offsets` (outside a capture)."""
    generator = torch.cuda.default_generators[device_index]
    offset = generator.get_offset()
    if offset < offsets:
        raise GeneratorRewindError(
            f"the CUDA generator's offset is {offset}, below the {offsets} the eager "
            "draw before this capture took; something reset the generator during "
            "the capture: reseed it after capturing, not during"
        )
    generator.set_offset(offset - offsets)


class OutsideGraphBatch:
    """One forward's seeds in the persistent buffer, handed out in order by `take`."""

    __slots__ = (
        "_device_index",
        "_owner",
        "_seeds",
        "_stream_handle",
        "consumed",
        "drawn",
        "drawn_count",
        "under_capture",
    )

    def __init__(
        self, owner: str, seeds: tuple[torch.Tensor, ...], device_index: int, drawn: int
    ) -> None:
        self._owner = owner
        self._seeds = seeds
        self._device_index = device_index
        self._stream_handle = core._current_stream_handle(device_index)
        self.drawn = drawn > 0
        self.drawn_count = drawn
        self.under_capture: bool | None = None
        """Decided by the first take: whether this forward is being captured."""
        self.consumed = 0

    def take(self) -> torch.Tensor | None:
        """The next seed; None (the caller draws as stock) beyond N, or when the
        capture state differs from the one the forward's first seed was taken in."""
        k = self.consumed
        if k >= len(self._seeds):
            return None
        capturing = core._is_capturing()
        if self.under_capture is None:
            self.under_capture = capturing
        elif capturing != self.under_capture:
            return None
        # Under capture nothing runs: a replay reads on the stream it is launched on,
        # after its hook's draw there; the capture's own stream (torch's side stream
        # by default) orders nothing.
        if not capturing and (
            core._current_stream_handle(self._device_index) != self._stream_handle
        ):
            raise WrongStreamError(
                f"{self._owner}: seed {k} taken on {torch.cuda.current_stream()}, "
                f"but its forward began on stream {self._stream_handle:#x}; all "
                "SSU calls of a forward must run on the stream it began on"
            )
        self.consumed = k + 1
        return self._seeds[k]


class OutsideGraphPrefetch(SeedPrefetch):
    """SeedPrefetch's eager buffer as the one buffer of every forward and graph."""

    def schedule_outside(self, count: int | None = None) -> OutsideGraphBatch:
        """The batch of a forward beginning now: drawn eagerly into the buffer
        (`count` seeds, default N), or, inside a capture, not drawn at all."""
        buffer = self._eager_buffer
        if core._is_capturing():
            return OutsideGraphBatch(self.owner, buffer.seeds, self._device_index, 0)
        count = self.num_seeds if count is None else count
        handover = self._hand_over()
        if handover is not None:
            handover.wait()
        self.draw(buffer.whole if count == self.num_seeds else buffer.whole[:count])
        return OutsideGraphBatch(self.owner, buffer.seeds, self._device_index, count)


_PERSISTENT: dict[tuple[int, int], OutsideGraphPrefetch] = {}


def persistent_prefetch(
    owner: str, num_seeds: int, device: torch.device, draw
) -> OutsideGraphPrefetch:
    """The process's prefetch machinery for (device, N), made once: an engine that
    attaches its prefetcher again (vLLM does, per KV cache config) keeps the buffer
    its graphs read, and the handover state of its last stream."""
    key = (device.index, num_seeds)
    made = _PERSISTENT.get(key)
    if made is None:
        made = _PERSISTENT[key] = OutsideGraphPrefetch(owner, num_seeds, device, draw)
    else:
        made.draw = draw
    return made


class OutsideGraphPrefetcher:
    """The k-th `next_seed()` inside `forward()` returns seed k, drawn eagerly as
    the forward began (nothing drawn when it began inside a capture); None outside
    a forward and beyond N. A ForwardHooks hook too (`on_forward_begin/end`)."""

    def __init__(self, prefetch: OutsideGraphPrefetch) -> None:
        self.prefetch = prefetch
        self._batch: OutsideGraphBatch | None = None
        self._full_cudagraph = False
        self.last_capture_took = 0
        """Seeds the last forward captured took from the buffer (0: none captured)."""
        self._warned_unconsumed = False

    @contextmanager
    def forward(self, full_cudagraph: bool = False, count: int | None = None) -> Iterator[None]:
        """One forward, drawn for alike whether eager, captured or replayed;
        `full_cudagraph` (a FULL graph's capture or replay) only tells a replay,
        which takes no seed in Python, from an eager forward that took none;
        `count`: seeds to draw, default N (a replay draws what its graph's capture
        took)."""
        self._begin(count, full_cudagraph)
        try:
            yield
        finally:
            self._end()

    def on_forward_begin(self, info: ForwardInfo) -> None:
        if info.runs_ssu and not info.micro_batched:
            self._begin(None, info.full_cudagraph)
        else:
            self._batch = None

    def on_forward_end(self, info: ForwardInfo) -> None:
        self._end()

    def _begin(self, count: int | None, full_cudagraph: bool) -> None:
        self._full_cudagraph = full_cudagraph
        self._batch = self.prefetch.schedule_outside(count)

    def next_seed(self) -> torch.Tensor | None:
        batch = self._batch
        return None if batch is None else batch.take()

    def _end(self) -> None:
        batch, self._batch = self._batch, None
        if batch is None:
            return
        if batch.under_capture:
            self.last_capture_took = batch.consumed
            if batch.drawn:
                rewind_generator(self.prefetch._device_index, OFFSETS_PER_DRAW * batch.drawn_count)
        elif (
            batch.consumed < batch.drawn_count
            and not (self._full_cudagraph and batch.consumed == 0)  # a replay
            and not self._warned_unconsumed
        ):
            self._warned_unconsumed = True
            logger.warning(
                "%s: a forward consumed %d of the %d seeds it drew, so its later "
                "seeds differ from stock's (warned once)",
                self.prefetch.owner,
                batch.consumed,
                batch.drawn_count,
            )


def outside_graph_prefetcher(
    num_seeds: int, device: torch.device, draw, owner: str = "outside-graph"
) -> OutsideGraphPrefetcher:
    """A prefetcher over the process's persistent buffer for (device, N)."""
    return OutsideGraphPrefetcher(persistent_prefetch(owner, num_seeds, device, draw))
