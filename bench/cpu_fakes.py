"""Stand-ins that let the CPU unit tests run the bench's whole flow without a GPU.

`LayoutCheckingSsu` refuses what FlashInfer 0.7.2.post1's SSU refuses
(`csrc/selective_state_update.cu`: shapes, strides, dtypes) and what the
Python wrapper checks of rand_seed, so the model's calls are checked here
before the one run on the GPU.  The fake clock and graph let
`BenchSession` run end to end on the CPU.
"""

from __future__ import annotations

import torch

from .synthetic_model import DecodeModel
from .target import Target
from .variants import SeedSource, run_step


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


class LayoutCheckingSsu:
    """Checks each call as FlashInfer would, then records the seed it was given."""

    def __init__(self) -> None:
        self.seeds: list[int] = []

    def __call__(
        self,
        state: torch.Tensor,
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        D: torch.Tensor,
        *,
        z: torch.Tensor | None,
        dt_bias: torch.Tensor,
        dt_softplus: bool,
        state_batch_indices: torch.Tensor,
        dst_state_batch_indices: torch.Tensor,
        pad_slot_id: int,
        out: torch.Tensor,
        rand_seed: torch.Tensor,
        philox_rounds: int,
    ) -> torch.Tensor:
        batch, nheads, dim = x.shape
        cache, state_heads, state_dim, dstate = state.shape
        ngroups = B.size(1)
        _require(state.dtype == torch.float16, "fp16 state (stochastic rounding)")
        _require((state_heads, state_dim) == (nheads, dim), "state heads/dim match x")
        _require(state.stride(3) == 1, "state dim 3 stride 1")
        _require(state.stride(2) == dstate, "state dim 2 contiguous with dim 3")
        _require(state.stride(1) == dim * dstate, "state dim 1 contiguous with dim 2")
        _require(cache >= batch, "state.size(0) >= batch")
        _require(nheads % ngroups == 0, "nheads divisible by ngroups")
        _require(x.stride(2) == 1 and x.stride(1) == dim, "x: last dim contiguous, stride(1)=dim")
        _require(dt.shape == x.shape, "dt shape = x shape")
        _require(dt.stride(1) == 1 and dt.stride(2) == 0, "dt strides (_, 1, 0): tie_hdim")
        _require(A.shape == (nheads, dim, dstate) and A.stride() == (1, 0, 0), "A broadcast")
        _require(A.dtype == torch.float32, "A fp32")
        for name, tensor in (("D", D), ("dt_bias", dt_bias)):
            _require(tensor.shape == (nheads, dim), f"{name} shape (nheads, dim)")
            _require(tensor.stride() == (1, 0), f"{name} strides (1, 0)")
            _require(tensor.dtype == dt.dtype, f"{name} has dt's dtype")
        for name, tensor in (("B", B), ("C", C)):
            _require(tensor.shape == (batch, ngroups, dstate), f"{name} shape")
            _require(tensor.stride(2) == 1 and tensor.stride(1) == dstate, f"{name} strides")
            _require(tensor.dtype == x.dtype, f"{name} has x's dtype")
        _require(z is None, "no z, as vLLM's decode path")
        _require(out.is_contiguous() and out.shape == x.shape, "out contiguous, x's shape")
        _require(out.dtype == x.dtype, "out has x's dtype")
        for indices in (state_batch_indices, dst_state_batch_indices):
            _require(indices.dim() in (1, 2) and indices.size(0) >= batch, "indices shape")
            _require(indices.dtype == torch.int32, "int32 indices")
            _require(bool((indices != pad_slot_id).all()), "no live slot is the pad slot")
            _require(bool((indices < cache).all()), "indices inside the cache")
        _require(rand_seed.numel() == 1 and rand_seed.dtype == torch.int64, "int64 one-seed")
        _require(philox_rounds > 0, "philox_rounds > 0 with a seed")
        _require(dt_softplus, "dt_softplus as vLLM")
        self.seeds.append(int(rand_seed))
        return out


def cpu_target(ssu: LayoutCheckingSsu) -> Target:
    return Target(ssu=ssu, device=torch.device("cpu"), gpu="CPU Test Device", platform="cpu")


class EagerGraph:
    """A 'graph' that replays by running the step eagerly, as captured (the CPU has no graphs)."""

    def __init__(self, model: DecodeModel, source: SeedSource, record: torch.Tensor | None):
        self._model, self._source, self._record = model, source, record

    def replay(self) -> None:
        run_step(self._model, self._source, captured=True, record=self._record)


def capture_eagerly(
    model: DecodeModel, source: SeedSource, record: torch.Tensor | None = None
) -> EagerGraph:
    return EagerGraph(model, source, record)


def counting_clock(step, steps: int) -> float:
    """Runs the steps, returns a made-up time: the CPU's timings mean nothing here."""
    for _ in range(steps):
        step()
    return 100.0
