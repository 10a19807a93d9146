"""An opt-in check that nothing else draws from the generator during a forward.

Prefetched seeds are stock's only if, between a forward's seed draws and its
SSU calls, nothing else draws from the device's default CUDA generator:
stock draws seed k just before SSU call k, so a draw between two Mamba layers
(vLLM's `VLLM_MOE_ROUTING_SIMULATION_STRATEGY` draws `torch.rand` in every
MoE layer) lands between two of stock's seeds, while the prefetched seeds
were all drawn before it.  The outputs stay valid; they are no longer
bit-identical to stock's.

`GeneratorOffsetCheck` reads the generator's offset, a host-side counter
(no GPU work, no synchronize), where an eager forward's draws end and again
at every seed taken; a moved offset means another draw in between, and is
warned about once.  Draws before a forward's first seed in the
forward-context design, and after its last seed in either, come where stock
would make them too, so they are not flagged.  Captured forwards are not
checked: a graph's offsets are relative to its replay.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


class GeneratorOffsetCheck:
    """Compares the default CUDA generator's offset with where the prefetch left it."""

    def __init__(self, owner: str, device_index: int) -> None:
        self._owner = owner
        self._generator = torch.cuda.default_generators[device_index]
        self._warned = False

    def offset(self) -> int:
        return self._generator.get_offset()

    def verify(self, expected: int, seed_index: int) -> int:
        """The offset now; warns once if it is not `expected` at seed `seed_index`."""
        now = self._generator.get_offset()
        if now != expected and not self._warned:
            self._warned = True
            logger.warning(
                "%s: the CUDA generator moved by %d between a forward's seed draws "
                "and its Mamba SSU call %d, so something else drew random numbers "
                "between Mamba layers (vLLM's VLLM_MOE_ROUTING_SIMULATION_STRATEGY "
                "does, with torch.rand in every MoE layer). The prefetched seeds are "
                "then not stock's, and outputs are not bit-identical to stock's; unset "
                "VLLM_MAMBA_SR_SEED_PREFETCH for stock's seeds. (warned once)",
                self._owner,
                now - expected,
                seed_index,
            )
        return now
