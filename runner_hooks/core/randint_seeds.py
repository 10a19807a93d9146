# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The values of N `torch.randint(0, 2**32, (1,))` calls on CUDA, from one Triton
launch outside any CUDA graph, advancing the generator as those calls would.

The arithmetic of one such call (ATen's random_from_to, range 2**32, numel 1): it
reserves 4 Philox offsets from the generator's offset o, and its thread 0 runs
curand_init(seed, 0, o) then curand4. So Philox4x32-10's key is the 64-bit seed
(low word first), its counter is o / 4 in words 0-1 with words 2-3 zero, and the
value is (x << 32 | y) % 2**32: output word 1, y. Call k of N reads counter
o / 4 + k, and the N calls leave the offset at o + 4N.
"""

import torch
import triton
import triton.language as tl

from .prefetch import OFFSETS_PER_DRAW

_BLOCK = 128


# Typed as strings, which Triton reads and a placeholder module need not define;
# unspecialized, so one compilation serves every seed, counter and N.
@triton.jit(do_not_specialize=["n", "seed", "counter"])
def _randint_seeds_kernel(
    out_ptr, n, seed: "tl.uint64", counter: "tl.uint64", BLOCK: tl.constexpr
):
    k = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    c = counter + k.to(tl.uint64)
    c0 = (c & 0xFFFFFFFF).to(tl.uint32)
    c1 = (c >> 32).to(tl.uint32)
    zero = tl.zeros_like(c0)
    _, y, _, _ = tl.philox(seed, c0, c1, zero, zero, 10)
    tl.store(out_ptr + k, y.to(tl.uint64).to(tl.int64, bitcast=True), mask=k < n)


def fill_randint_seeds(out: torch.Tensor) -> None:
    """Fills `out` (contiguous int64, CUDA) with the values of len(out) consecutive
    `torch.randint(0, 2**32, (1,))` calls on its device, on the current stream, and
    advances the device's default generator as they would. Not inside a capture:
    the generator's offset is a host value only outside one (torch refuses it).
    Reading and moving the offset is not one step: no other thread may draw from
    the generator meanwhile, as none does while a model runner runs a forward."""
    n = out.numel()
    if n == 0:
        return
    generator = torch.cuda.default_generators[out.device.index]
    # A multiple of 4: every draw reserves a multiple, and set_offset refuses others.
    offset = generator.get_offset()
    randint_seeds_at(out, generator.initial_seed(), offset)
    generator.set_offset(offset + OFFSETS_PER_DRAW * n)


def randint_seeds_at(out: torch.Tensor, seed: int, offset: int) -> None:
    """Fills `out` with the values randint calls would draw from a generator at
    (`seed`, `offset`), `offset` a multiple of 4; moves no generator. Runs on CPU
    tensors under Triton's interpreter (TRITON_INTERPRET=1)."""
    n = out.numel()
    grid = (triton.cdiv(n, _BLOCK),)
    _randint_seeds_kernel[grid](out, n, seed, offset // OFFSETS_PER_DRAW, BLOCK=_BLOCK)
