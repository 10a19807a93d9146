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
from dataclasses import dataclass
from typing import Protocol

import torch

logger = logging.getLogger(__name__)

NO_CUDA = "no CUDA device"

# Read on every SSU call: no Python frame, no Stream object.
_is_capturing = torch._C._cuda_isCurrentStreamCapturing
_current_stream_handle = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class IncompleteSeedBatchError(RuntimeError):
    """A forward captured in a CUDA graph consumed fewer seeds than it drew."""


class WrongStreamError(RuntimeError):
    """A seed was taken on another stream than the one its forward began on."""


class SeedDrawer(Protocol):
    """Fills `out` with len(out) stock draws' values, on the current stream."""

    name: str

    def draw(self, out: torch.Tensor) -> None: ...


def cuda_device(device: torch.device | str, num_seeds: int) -> torch.device | None:
    """The CUDA device to prefetch `num_seeds` seeds on, or None without CUDA."""
    if type(num_seeds) is not int or num_seeds < 1:
        raise ValueError(f"num_ssu_calls must be a positive int, got {num_seeds!r}")
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    if device.index is None:
        device = torch.device("cuda", torch.accelerator.current_device_index())
    return device


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
        self._stream_handle = _current_stream_handle(device_index)  # type: ignore[misc]
        self.under_capture = under_capture
        self.consumed = 0

    def take(self) -> torch.Tensor | None:
        """The next seed; None (the caller draws as stock) beyond the batch or
        when the capture state differs from the batch's."""
        k = self.consumed
        if k >= len(self._seeds) or _is_capturing() != self.under_capture:
            return None
        if _current_stream_handle(self._device_index) != self._stream_handle:  # type: ignore[misc]
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
        self, owner: str, num_seeds: int, device: torch.device, drawer: SeedDrawer
    ) -> None:
        self.owner = owner
        self.num_seeds = num_seeds
        self.device = device
        self._device_index = device.index
        self.drawer = drawer
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
        handle = _current_stream_handle(self._device_index)  # type: ignore[misc]
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
        self.drawer.draw(buffer.whole)
        return SeedBatch(self.owner, buffer, self._device_index, under_capture)

    def finish(self, batch: SeedBatch) -> None:
        """Closes a forward; reports a batch that was not fully consumed."""
        if batch.complete:
            return
        if batch.under_capture:
            raise IncompleteSeedBatchError(
                f"{self.owner}: a captured forward consumed {batch.consumed} of "
                f"the {self.num_seeds} seeds it drew; it must call the SSU once per "
                "Mamba-2 layer, or be marked runs_ssu=False"
            )
        if not self._warned_unconsumed:
            self._warned_unconsumed = True
            logger.warning(
                "%s: a forward consumed %d of the %d seeds it drew, so later seeds "
                "differ from stock's (warned once)",
                self.owner,
                batch.consumed,
                self.num_seeds,
            )


class SeedPrefetcher:
    """A prefetcher's machinery, `prefetch`, or None and why (`inactive_reason`)."""

    def __init__(self, num_ssu_calls: int, device: torch.device | str) -> None:
        cuda = cuda_device(device, num_ssu_calls)
        made = NO_CUDA if cuda is None else self._seed_prefetch(num_ssu_calls, cuda)
        self.prefetch = None if isinstance(made, str) else made
        self.inactive_reason = made if isinstance(made, str) else None

    def _seed_prefetch(
        self, num_ssu_calls: int, device: torch.device
    ) -> SeedPrefetch | str:
        """The machinery for `num_ssu_calls` seeds on `device`, or why none."""
        raise NotImplementedError
