# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A forward's stochastic-rounding seeds, drawn up front and taken by index.

Race-free with CUDA stream order and events only:
- Values: the drawer advances the CUDA generator as the SSU calls' N per-call
  draws (`torch.randint(0, 2**32, (1,))` each) would, so seed k is the k-th
  call's value while nothing else draws from it between Mamba layers.
- Seeds before readers: a forward's draws are enqueued on its stream as it
  begins, and its readers (its SSU kernels, or the graph it replays) run on that
  stream after them. A forward found on another stream at its first or last
  seed draws the rest per call, from the generator put back as far.
- One buffer, read by every forward and every captured graph: the next forward's
  draws are enqueued after this forward's readers on the same stream or, on
  another stream, after a handover event recorded on the one its readers were
  last found on (which may be the legacy default stream, handle 0, which pool
  streams do not sync with: "no earlier forward" is None, not 0). The buffer is
  `record_stream`ed on each stream that reads it, so freeing it with its
  prefetcher waits for those reads.
- Capture: a forward that begins inside a capture draws nothing, and its graph
  reads the buffer, which the draws before each of its replays fill.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._logging import init_logger

logger = init_logger(__name__)

_is_capturing = torch.cuda.is_current_stream_capturing

OFFSETS_PER_DRAW = 4
"""Philox offsets one per-call draw (randint of numel 1) reserves."""


def _public_stream_handle(device_index: int) -> int:
    return torch.cuda.current_stream(device_index).cuda_stream


# Read at a forward's first and last seed. The raw handle needs no Stream
# object; torch's public equivalent builds one per call (_public_stream_handle).
_current_stream_handle: Callable[[int], int] = getattr(
    torch._C, "_cuda_getCurrentRawStream", _public_stream_handle
)


class GeneratorRewindError(RuntimeError):
    """The generator cannot be put back after a capture to where per-call draws
    leave it."""


@dataclass(frozen=True, eq=False)
class SeedBuffer:
    whole: torch.Tensor
    seeds: tuple[torch.Tensor, ...]  # one-element views of `whole`, one per seed


class SeedBatch:
    """The seeds of one forward, handed out in order by `take`.

    The capture and stream checks run at the first and the last seed only: a
    capture encloses every SSU call of a forward or none (a FULL graph the whole
    model, a PIECEWISE graph none of the SSU, whose op splits the graph), and a
    runner keeps a forward on one stream. The check at the last seed catches a
    forward that entered or left a capture, or changed stream, after its first.
    """

    __slots__ = (
        "_device_index",
        "_hand_back",
        "_last",
        "_seeds",
        "_stream_handle",
        "consumed",
        "eager_draws",
        "handed_back",
        "under_capture",
    )

    def __init__(
        self,
        hand_back: "Callable[[SeedBatch, int], None]",
        seeds: tuple[torch.Tensor, ...],
        device_index: int,
        eager_draws: int,
        under_capture: bool | None,
    ) -> None:
        """`hand_back(batch, k)`: gives seeds k.. back to inline draws;
        `eager_draws`: seeds drawn for it outside any capture; `under_capture`:
        None while its first seed, taken in a capture or not, is to tell."""
        self._hand_back = hand_back
        self._seeds = seeds
        self._last = len(seeds) - 1
        self._device_index = device_index
        self._stream_handle: int | None = _current_stream_handle(device_index)
        self.eager_draws = eager_draws
        self.under_capture = under_capture
        self.consumed = 0
        self.handed_back = False

    def take(self) -> torch.Tensor | None:
        """The next seed; None (the caller draws its own) beyond the batch, when
        the capture state at the first or last seed differs from the batch's, and
        from a seed taken on another stream than the forward's on."""
        k = self.consumed
        if k > self._last:
            return None
        if (k == 0 or k == self._last) and not self._checked(k):
            return None
        self.consumed = k + 1
        return self._seeds[k]

    def _checked(self, k: int) -> bool:
        """Whether seed k may be handed out here."""
        return self._same_capture_state() and self._same_stream(k)

    def _same_capture_state(self) -> bool:
        capturing = _is_capturing()
        if self.under_capture is None:
            self.under_capture = capturing
            if capturing:
                # Drawn before the capture began: each replay reads the draws
                # enqueued before it on its own stream, not the capture's.
                self._stream_handle = None
        return capturing == self.under_capture

    def _same_stream(self, k: int) -> bool:
        """Whether seed k is taken on the forward's stream; if not, it and the
        later seeds are handed back, to be drawn inline."""
        handle = self._stream_handle
        if handle is None or _current_stream_handle(self._device_index) == handle:
            return True
        self._last = k - 1
        self.handed_back = True
        self._hand_back(self, k)
        return False

    @property
    def complete(self) -> bool:
        return self.consumed == len(self._seeds)


class SeedPrefetch:
    """Draws each forward's seeds on the forward's stream as it begins."""

    def __init__(
        self,
        owner: str,
        num_seeds: int,
        device: torch.device,
        draw: Callable[[torch.Tensor], None],
    ) -> None:
        """`draw(out)` fills `out` with len(out) per-call draws' values, on the
        current stream, advancing the CUDA generator as they would."""
        self.owner = owner
        self.num_seeds = num_seeds
        self.device = device
        self._device_index = device.index
        self.draw = draw
        self._buffer = self._new_buffer()
        # The last drawing stream (None before the first) and its handle.
        self._stream: torch.cuda.Stream | None = None
        self._stream_handle: int | None = None
        self._handover = torch.Event()

    def _new_buffer(self) -> SeedBuffer:
        whole = torch.empty(self.num_seeds, dtype=torch.int64, device=self.device)
        return SeedBuffer(whole, whole.split(1))

    def _hand_over(self) -> torch.Event | None:
        """The event this forward's draws wait on, if its stream changed."""
        handle = _current_stream_handle(self._device_index)
        if handle == self._stream_handle:
            return None
        previous = self._stream
        stream = torch.cuda.current_stream(self._device_index)
        self._stream, self._stream_handle = stream, handle
        self._buffer.whole.record_stream(stream)
        if previous is None:
            return None
        self._handover.record(previous)
        return self._handover

    def schedule(self) -> SeedBatch:
        """The batch of a forward beginning now, its N seeds drawn into the
        buffer; inside a capture, nothing is drawn."""
        seeds = self._buffer.seeds
        if _is_capturing():
            return SeedBatch(self._hand_back, seeds, self._device_index, 0, True)
        self.fill(self.num_seeds)
        return SeedBatch(
            self._hand_back, seeds, self._device_index, self.num_seeds, None
        )

    def fill(self, count: int) -> None:
        """Draws the buffer's first `count` seeds on the current stream (outside
        a capture), after the readers of the last draws."""
        handover = self._hand_over()
        if handover is not None:
            handover.wait()
        whole = self._buffer.whole
        self.draw(whole if count == self.num_seeds else whole[:count])

    def finish(self, batch: SeedBatch, full_cudagraph: bool = False) -> None:
        """Closes a forward. One whose seeds were drawn before its capture began
        has the generator put back as far, as a capture of per-call draws leaves
        it outside the graph. One that left seeds unconsumed is a warning, once,
        unless it is a FULL graph's replay (`full_cudagraph`, no seed taken),
        whose graph reads them, or it handed them back."""
        if batch.under_capture and batch.eager_draws:
            self._rewind(OFFSETS_PER_DRAW * batch.eager_draws)
        if batch.complete or batch.handed_back:
            return
        if not (full_cudagraph and batch.consumed == 0):
            logger.warning_once(
                "%s: a %sforward took fewer than the %d seeds it drew, so the "
                "seeds of later forwards differ from those drawn without prefetching",
                self.owner,
                "captured " if batch.under_capture else "",
                self.num_seeds,
            )

    def _hand_back(self, batch: SeedBatch, k: int) -> None:
        """Seeds k.. of `batch`, found on another stream than its forward's, go
        to inline draws there: the generator is put back to where the k-th call's
        draw reads it, and the next draws wait for this stream's reads."""
        logger.warning_once(
            "%s: an SSU call ran on another stream than its forward began on; "
            "that forward's later seeds are drawn inline",
            self.owner,
        )
        if _is_capturing():
            return
        if batch.eager_draws:
            self._rewind(OFFSETS_PER_DRAW * (batch.eager_draws - k))
        self._hand_over()

    def _rewind(self, offsets: int) -> None:
        """Moves the generator back by `offsets` (outside a capture, where
        nothing else moves it: a capture's draws reserve offsets in its graph)."""
        generator = torch.cuda.default_generators[self._device_index]
        offset = generator.get_offset()
        if offset < offsets:
            raise GeneratorRewindError(
                f"{self.owner}: the CUDA generator's offset is {offset}, below the "
                f"{offsets} drawn before this capture; something reset the "
                "generator during the capture: reseed it after capturing, not during"
            )
        generator.set_offset(offset - offsets)
