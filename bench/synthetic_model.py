"""A synthetic decode step of a Nemotron-H-like model, one TP rank: what the seed path sits in.

Per Mamba-2 layer, in vLLM's order (`MambaMixer2.forward`, decode branch):
[in_proj GEMM] -> conv1d -> seed -> SSU -> [out_proj GEMM].

* conv1d is stood in for by one elementwise kernel over the conv channels
  (vLLM's `causal_conv1d_update` is one small kernel too); its output feeds
  the SSU, as in vLLM.
* The SSU is called exactly as vLLM 0.33.0's `FlashInferSSUBackend` calls
  FlashInfer: x, B and C are strided views into the conv output, dt a view
  into the projection broadcast over head_dim, A, D and dt_bias per-head
  values broadcast as vLLM's `expand` makes them, state_batch_indices (and
  the same tensor as dst_state_batch_indices) of shape (batch, 1), slot 0
  the null block (`pad_slot_id=NULL_BLOCK_ID`), no z, dt_softplus, an fp16
  state with stochastic rounding.
* The GEMMs (optional) are bf16 with per-layer weights, so they stream their
  weights from HBM as a real model does instead of hitting L2.  A served
  model may quantize them (NVFP4); they are there to give the step a
  realistic bulk, not to model its exact GEMM time.

The model takes its SSU as an argument: the bench passes FlashInfer's or vLLM's
Triton SSU (--bench-ssu), the CPU unit tests a stand-in that checks FlashInfer's
layout rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

NULL_SLOT = 0
"""vLLM's NULL_BLOCK_ID, passed as pad_slot_id: state slot 0 is never a request's."""


@dataclass(frozen=True)
class MixerShape:
    """One TP4 rank of a Nemotron-H-like Mamba-2 mixer (128 heads, 8 groups, hidden 4096 in all)."""

    nheads: int = 32
    head_dim: int = 64
    dstate: int = 128
    ngroups: int = 2
    hidden: int = 4096
    philox_rounds: int = 5

    @property
    def inner(self) -> int:
        """x channels: heads x head_dim."""
        return self.nheads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """conv1d channels: x, B and C."""
        return self.inner + 2 * self.ngroups * self.dstate

    @property
    def in_proj_dim(self) -> int:
        """in_proj outputs: z, then x/B/C, then dt."""
        return self.inner + self.conv_dim + self.nheads

    def describe(self) -> str:
        return (
            f"SSU: {self.nheads} heads x {self.head_dim} head dim x {self.dstate} state, "
            f"{self.ngroups} groups, fp16 state, stochastic rounding with "
            f"{self.philox_rounds} Philox rounds; GEMMs (if on) hidden {self.hidden}"
        )


class SsuKernel(Protocol):
    """The part of `flashinfer.mamba.selective_state_update`'s signature that vLLM uses."""

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
    ) -> object: ...


@dataclass(frozen=True)
class MambaLayer:
    """One layer's parameters and SSM state, in the layouts the SSU is handed."""

    state: torch.Tensor
    """(batch + 1, nheads, head_dim, dstate) fp16; slot 0 is the null block."""
    A: torch.Tensor
    """(nheads, head_dim, dstate) fp32, strides (1, 0, 0)."""
    D: torch.Tensor
    """(nheads, head_dim) bf16, strides (1, 0)."""
    dt_bias: torch.Tensor
    """(nheads, head_dim) bf16, strides (1, 0)."""
    conv_weight: torch.Tensor
    """(conv_dim,) bf16: the conv1d stand-in's per-channel scale."""
    in_proj: torch.Tensor | None
    """(in_proj_dim, hidden) bf16, or None without GEMMs."""
    out_proj: torch.Tensor | None
    """(hidden, inner) bf16, or None without GEMMs."""


class DecodeModel:
    """`num_layers` Mamba-2 layers at one decode batch size, with preallocated activations.

    Activations are allocated once, so an eager step allocates nothing but
    what its seed path allocates (stock's randint), and a captured step
    writes only these buffers.
    """

    def __init__(
        self,
        shape: MixerShape,
        *,
        num_layers: int,
        batch_size: int,
        gemms: bool,
        device: torch.device,
        ssu: SsuKernel,
        init_seed: int = 0,
    ) -> None:
        self.shape = shape
        self.batch_size = batch_size
        self.device = device
        self._ssu = ssu
        # A private generator: building the model must not move the default
        # CUDA generator that the seeds come from.
        generator = torch.Generator(device=device).manual_seed(init_seed)

        def randn(*size: int, scale: float = 1.0, dtype: torch.dtype = torch.bfloat16):
            values = torch.randn(*size, generator=generator, device=device)
            return (values * scale).to(dtype)

        s = shape
        self.proj = randn(batch_size, s.in_proj_dim)
        self.xbc = torch.zeros(batch_size, s.conv_dim, dtype=torch.bfloat16, device=device)
        self.ssm_out = torch.zeros(
            batch_size, s.nheads, s.head_dim, dtype=torch.bfloat16, device=device
        )
        self.slots = torch.arange(1, batch_size + 1, dtype=torch.int32, device=device).unsqueeze(-1)
        self.hidden = randn(batch_size, s.hidden) if gemms else None
        self.layer_out = (
            torch.zeros(batch_size, s.hidden, dtype=torch.bfloat16, device=device)
            if gemms
            else None
        )

        # Views as MambaMixer2 makes them; none of them copies.
        self.xbc_in = self.proj[:, s.inner : s.inner + s.conv_dim]
        self.dt = self.proj[:, s.inner + s.conv_dim :][:, :, None].expand(-1, -1, s.head_dim)
        bc = s.ngroups * s.dstate
        self.x = self.xbc[:, : s.inner].view(batch_size, s.nheads, s.head_dim)
        self.B = self.xbc[:, s.inner : s.inner + bc].view(batch_size, s.ngroups, s.dstate)
        self.C = self.xbc[:, s.inner + bc :].view(batch_size, s.ngroups, s.dstate)
        self.ssm_out_flat = self.ssm_out.view(batch_size, s.inner)

        def per_head(values: torch.Tensor) -> torch.Tensor:
            return values[:, None].expand(-1, s.head_dim)

        self.layers = [
            MambaLayer(
                state=torch.zeros(
                    batch_size + 1,
                    s.nheads,
                    s.head_dim,
                    s.dstate,
                    dtype=torch.float16,
                    device=device,
                ),
                # vLLM: A = -exp(A_log), A_log from log(1..16) at init.
                A=(
                    -torch.exp(
                        torch.rand(s.nheads, generator=generator, device=device) * math.log(16)
                    )
                )[:, None, None].expand(-1, s.head_dim, s.dstate),
                D=per_head(torch.ones(s.nheads, dtype=torch.bfloat16, device=device)),
                dt_bias=per_head(randn(s.nheads, scale=0.5)),
                conv_weight=randn(s.conv_dim, scale=0.5),
                in_proj=randn(s.in_proj_dim, s.hidden, scale=s.hidden**-0.5) if gemms else None,
                out_proj=randn(s.hidden, s.inner, scale=s.inner**-0.5) if gemms else None,
            )
            for _ in range(num_layers)
        ]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def forward(
        self, seed_for_layer: Callable[[], torch.Tensor], record: torch.Tensor | None = None
    ) -> None:
        """Enqueues one decode step; `seed_for_layer()` gives each layer's rand_seed, in order.

        record: an int64 tensor of num_layers elements; when given, each
        layer's seed is copied into it on the current stream right after its
        SSU, i.e. the value the SSU read, after whatever wait guarded it.
        """
        s = self.shape
        for index, layer in enumerate(self.layers):
            if layer.in_proj is not None:
                torch.mm(self.hidden, layer.in_proj.t(), out=self.proj)
            torch.mul(self.xbc_in, layer.conv_weight, out=self.xbc)
            seed = seed_for_layer()
            self._ssu(
                layer.state,
                self.x,
                self.dt,
                layer.A,
                self.B,
                self.C,
                layer.D,
                z=None,
                dt_bias=layer.dt_bias,
                dt_softplus=True,
                state_batch_indices=self.slots,
                dst_state_batch_indices=self.slots,
                pad_slot_id=NULL_SLOT,
                out=self.ssm_out,
                rand_seed=seed,
                philox_rounds=s.philox_rounds,
            )
            if record is not None:
                record[index : index + 1].copy_(seed)
            if layer.out_proj is not None:
                torch.mm(self.ssm_out_flat, layer.out_proj.t(), out=self.layer_out)
