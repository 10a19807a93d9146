# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A forward's stochastic-rounding seeds, drawn up front and taken by index.

Race-free with CUDA stream order and events only:
- Values: the drawer advances the CUDA generator as the N stock draws would, so
  seed k is stock's k-th while nothing else draws from it between Mamba layers.
- Seeds before readers: a forward's draws are enqueued on its stream as it
  begins, and its consumers run on that stream (`take` refuses others).
- The eager buffer, shared by eager forwards: a forward on another stream than
  the last eager one first waits on a handover event recorded on that stream,
  which may be the legacy default stream (handle 0, which pool streams do not
  sync with: "no earlier forward" is None, not 0). The buffer is
  `record_stream`ed on each stream that reads it, so freeing it with its
  prefetcher waits for those reads.
- Capture: a captured forward draws into a buffer of the graph's pool.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

_is_capturing = torch.cuda.is_current_stream_capturing


def _public_stream_handle(device_index: int) -> int:
    return torch.cuda.current_stream(device_index).cuda_stream


# Read on every SSU call. The raw handle needs no Stream object; torch's public
# equivalent builds one per call (see _public_stream_handle).
_current_stream_handle: Callable[[int], int] = getattr(
    torch._C, "_cuda_getCurrentRawStream", _public_stream_handle
)


class WrongStreamError(RuntimeError):
    """A seed was taken on another stream than the one its forward began on."""


@dataclass(frozen=True, eq=False)
class SeedBuffer:
    whole: torch.Tensor
    seeds: tuple[torch.Tensor, ...]  # one-element views of `whole`, one per seed


class SeedBatch:
    """The seeds of one forward, handed out in order by `take`."""

    __slots__ = (
        "_device_index",
        "_owner",
        "_seeds",
        "_stream_handle",
        "consumed",
        "under_capture",
    )

    def __init__(
        self, owner: str, buffer: SeedBuffer, device_index: int, under_capture: bool
    ) -> None:
        self._owner = owner
        self._seeds = buffer.seeds
        self._device_index = device_index
        self._stream_handle = _current_stream_handle(device_index)
        self.under_capture = under_capture
        self.consumed = 0

    def take(self) -> torch.Tensor | None:
        """The next seed; None (the caller draws as stock) beyond the batch or
        when the capture state differs from the batch's."""
        k = self.consumed
        if k >= len(self._seeds) or _is_capturing() != self.under_capture:
            return None
        if _current_stream_handle(self._device_index) != self._stream_handle:
            raise WrongStreamError(
                f"{self._owner}: seed {k} taken on {torch.cuda.current_stream()}, "
                f"but its forward began on stream {self._stream_handle:#x}; all "
                "SSU calls of a forward must run on the stream it began on"
            )
        self.consumed = k + 1
        return self._seeds[k]

    @property
    def complete(self) -> bool:
        return self.consumed == len(self._seeds)


class SeedPrefetch:
    """Draws each forward's N seeds on the forward's stream as it begins."""

    def __init__(
        self,
        owner: str,
        num_seeds: int,
        device: torch.device,
        draw: Callable[[torch.Tensor], None],
    ) -> None:
        """`draw(out)` fills `out` with len(out) stock draws' values, on the
        current stream, advancing the CUDA generator as they would."""
        self.owner = owner
        self.num_seeds = num_seeds
        self.device = device
        self._device_index = device.index
        self.draw = draw
        self._eager_buffer = self._new_buffer()
        # The last eager forward's stream (None before the first) and handle.
        self._eager_stream: torch.cuda.Stream | None = None
        self._eager_stream_handle: int | None = None
        self._handover = torch.cuda.Event()
        self._warned_unconsumed = False

    def _new_buffer(self) -> SeedBuffer:
        whole = torch.empty(self.num_seeds, dtype=torch.int64, device=self.device)
        return SeedBuffer(whole, whole.split(1))

    def _hand_over(self) -> torch.cuda.Event | None:
        """The event an eager forward's draws wait on, if its stream changed."""
        handle = _current_stream_handle(self._device_index)
        if handle == self._eager_stream_handle:
            return None
        previous = self._eager_stream
        stream = torch.cuda.current_stream(self._device_index)
        self._eager_stream, self._eager_stream_handle = stream, handle
        self._eager_buffer.whole.record_stream(stream)
        if previous is None:
            return None
        self._handover.record(previous)
        return self._handover

    def schedule(self) -> SeedBatch:
        """Enqueues the draws of one forward's N seeds; returns their batch."""
        if _is_capturing():
            return self._draw(self._new_buffer(), None, True)
        return self._draw(self._eager_buffer, self._hand_over(), False)

    def _draw(
        self, buffer: SeedBuffer, handover: torch.cuda.Event | None, under_capture: bool
    ) -> SeedBatch:
        if handover is not None:
            handover.wait()
        self.draw(buffer.whole)
        return SeedBatch(self.owner, buffer, self._device_index, under_capture)

    def finish(self, batch: SeedBatch) -> None:
        """Closes a forward; one that left seeds unconsumed is a warning, once
        (a capture too: a performance option never stops an engine)."""
        if batch.complete:
            return
        if not self._warned_unconsumed:
            self._warned_unconsumed = True
            logger.warning(
                "%s: a %sforward consumed %d of the %d seeds it drew, so its "
                "later seeds differ from stock's (warned once)",
                self.owner,
                "captured " if batch.under_capture else "",
                batch.consumed,
                self.num_seeds,
            )
