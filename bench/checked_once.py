"""The reset design with its eager guarantees checked once per forward, not once per
SSU call: the capture check and the stream check run at a forward's
first seed and again at its last, and the calls between only index the batch.

The guarantees, and why these two checks keep them:

- Every forward reads seeds drawn for it, none stale, none from another forward.
  A batch belongs to one forward (the prefetcher makes it as the forward begins,
  or at a FULL graph's first seed, and drops it as it ends), so no take returns
  another forward's seed. A seed is stale when drawn outside a graph and read
  inside it (each replay would read the capture-time value): the capture check
  refuses that. Checking it at the first seed suffices because a capture encloses
  either every SSU call of a forward or none: V1's CUDAGraphWrapper captures the
  whole model call, V2's capture loop the whole forward_fn, and PIECEWISE graphs
  leave the SSU out (its op splits the graph), so its calls run eagerly. The
  check at the last seed catches a forward that entered or left a capture after
  its first seed.
- A consumer on the wrong stream is caught. The forward's stream is set around
  its whole model call (the runner's, or the capture's stream); a forward whose
  SSU calls run on another stream than its draws is caught at its first seed, one
  that moved to another stream after it, at its last.

What the per-call check caught and this does not: a forward that switches stream
(or capture state) after its first seed and back before its last. vLLM's runners
do neither; a caller that did would read seeds unordered after their draws.
`bench/test_checked_once.py` shows each guarantee's test failing without its check.
"""

from __future__ import annotations

import torch

from runner_hooks.core import prefetch as core
from runner_hooks.core import reset
from runner_hooks.core.prefetch import SeedBatch, SeedBuffer, SeedPrefetch, WrongStreamError
from runner_hooks.hooks import ForwardInfo


class CheckedOnceBatch(SeedBatch):
    """A forward's seeds; the capture and stream checks at its first and last seed."""

    __slots__ = ("_last",)

    def __init__(
        self, owner: str, buffer: SeedBuffer, device_index: int, under_capture: bool
    ) -> None:
        super().__init__(owner, buffer, device_index, under_capture)
        self._last = len(self._seeds) - 1

    def take(self) -> torch.Tensor | None:
        """The next seed; None (the caller draws as stock) beyond the batch, or
        when the capture state at the first or last seed differs from the batch's."""
        k = self.consumed
        if k > self._last:
            return None
        if (k == 0 or k == self._last) and not self._checked(k):
            return None
        self.consumed = k + 1
        return self._seeds[k]

    def _checked(self, k: int) -> bool:
        """Whether seed k may be handed out here; raises on the wrong stream."""
        if core._is_capturing() != self.under_capture:
            return False
        if core._current_stream_handle(self._device_index) != self._stream_handle:
            raise WrongStreamError(
                f"{self._owner}: seed {k} taken on {torch.cuda.current_stream()}, "
                f"but its forward began on stream {self._stream_handle:#x}; all "
                "SSU calls of a forward must run on the stream it began on"
            )
        return True


class CheckedOncePrefetch(SeedPrefetch):
    """SeedPrefetch whose batches check once per forward (CheckedOnceBatch)."""

    def _draw(
        self, buffer: SeedBuffer, handover: torch.cuda.Event | None, under_capture: bool
    ) -> SeedBatch:
        if handover is not None:
            handover.wait()
        self.draw(buffer.whole)
        return CheckedOnceBatch(self.owner, buffer, self._device_index, under_capture)


class CheckedOncePrefetcher(reset.SRSeedPrefetcher):
    """The reset design's prefetcher over CheckedOncePrefetch; a ForwardHooks hook too."""

    def on_forward_begin(self, info: ForwardInfo) -> None:
        if info.runs_ssu and not info.micro_batched:
            self._begin(info.full_cudagraph)
        else:
            self._batch, self._draw_at_first_seed = None, False

    def on_forward_end(self, info: ForwardInfo) -> None:
        self._end()


def checked_once_prefetcher(
    num_seeds: int, device: torch.device, draw, owner: str = "checked-once"
) -> CheckedOncePrefetcher:
    return CheckedOncePrefetcher(CheckedOncePrefetch(owner, num_seeds, device, draw))
