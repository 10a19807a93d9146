"""The real FlashInfer SSUs' new state with prefetched seeds equals stock's, bit for bit.

Stochastic rounding makes the fp16 state depend on the seed; these tests run
the SSU of several layers with stock's inline seeds and with each design's
prefetched seeds, eagerly and over CUDA-graph replays, and compare the states'
raw bits.  Two kernels: `selective_state_update`, and ReplaySSM's
`checkpointing_ssu` (vLLM 0.30+'s `selective_state_update_replayssm_flashinfer`),
in the FlashInfer releases that have it (0.7.2 does; it builds for sm_80 on,
rounding in software below Blackwell).  ReplaySSM's first JIT build takes
minutes (tests/gpu/results/README.md).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from .harness import (
    DECODE,
    FULL_GRAPH,
    OUTSIDE_GRAPHS_ONLY,
    TRITON_DRAWER,
    Runner,
    require_drawer,
)

pytestmark = pytest.mark.gpu
ssu = pytest.importorskip("flashinfer.mamba", reason="needs FlashInfer").selective_state_update

LAYERS, BATCH, HEADS, HEAD_DIM, STATE, GROUPS = 6, 4, 8, 64, 128, 2
PHILOX_ROUNDS = 5
RING = 8
"""ReplaySSM's ring rows per slot: a replay window of RING - 1 cached tokens
beside the one new token of a decode step."""
REPLAYED = RING - 1
"""Cached tokens each ReplaySSM call replays (prev_num_accepted_tokens): with
that plus the new token past the replay window (RING - 1), every call
checkpoints, i.e. writes the fp16 state back, rounding it with its seed."""


class MambaLayers:
    """Inputs and fp16 states of `LAYERS` Mamba-2 decode layers, laid out as vLLM passes them."""

    def __init__(self, device: torch.device) -> None:
        inputs = torch.Generator(device).manual_seed(7)  # not the default generator

        def randn(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
            return torch.randn(*shape, generator=inputs, device=device).to(dtype)

        self.initial_states = randn(LAYERS, BATCH, HEADS, HEAD_DIM, STATE, dtype=torch.float16)
        self.states = self.initial_states.clone()
        self.x = randn(BATCH, HEADS, HEAD_DIM)
        self.dt = randn(BATCH, HEADS)[:, :, None].expand(-1, -1, HEAD_DIM)
        decay = -torch.rand(HEADS, generator=inputs, device=device)
        self.A = decay[:, None, None].expand(-1, HEAD_DIM, STATE)  # vLLM's tie_hdim strides
        self.B = randn(BATCH, GROUPS, STATE)
        self.C = randn(BATCH, GROUPS, STATE)
        self.D = randn(HEADS)[:, None].expand(-1, HEAD_DIM)
        self.dt_bias = randn(HEADS)[:, None].expand(-1, HEAD_DIM)
        self.slots = torch.arange(BATCH, dtype=torch.int32, device=device)
        self.out = torch.empty(BATCH, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device)

    def reset(self) -> None:
        self.states.copy_(self.initial_states)

    def forward(self, seed: Callable[[], torch.Tensor]) -> None:
        for layer in range(LAYERS):
            ssu(
                self.states[layer],
                self.x,
                self.dt,
                self.A,
                self.B,
                self.C,
                self.D,
                dt_bias=self.dt_bias,
                dt_softplus=True,
                state_batch_indices=self.slots,
                out=self.out,
                rand_seed=seed(),
                philox_rounds=PHILOX_ROUNDS,
            )

    def bits(self) -> torch.Tensor:
        return self.states.view(torch.int16).clone()


class ReplaySsmLayers(MambaLayers):
    """The same layers through ReplaySSM, called as vLLM's
    `selective_state_update_replayssm_flashinfer` calls it for one decode token
    (inputs with a token axis, each layer's ring of cached tokens), with every
    call replaying REPLAYED cached tokens and writing the state back."""

    def __init__(self, device: torch.device, kernel: Callable[..., torch.Tensor]) -> None:
        super().__init__(device)
        self._kernel = kernel
        cached = torch.Generator(device).manual_seed(8)
        x_ring = torch.randn(LAYERS, BATCH, HEADS, RING, HEAD_DIM, generator=cached, device=device)
        b_ring = torch.randn(LAYERS, BATCH, GROUPS, RING, STATE, generator=cached, device=device)
        dt_ring = torch.rand(LAYERS, BATCH, HEADS, RING, generator=cached, device=device) / 2
        # x's and B's dtype; dt is cached processed (bias and softplus applied), float32
        self.initial_rings = (x_ring.to(torch.bfloat16), b_ring.to(torch.bfloat16), dt_ring)
        self.rings = tuple(ring.clone() for ring in self.initial_rings)
        self.ring_start = torch.zeros(LAYERS, BATCH, dtype=torch.int32, device=device)
        self.replayed = torch.full_like(self.ring_start, REPLAYED)
        # One token per sequence: vLLM unsqueezes the token axis (dim 1).
        self.x, self.dt, self.B, self.C, self.out = (
            tensor.unsqueeze(1) for tensor in (self.x, self.dt, self.B, self.C, self.out)
        )

    def reset(self) -> None:
        super().reset()
        for ring, initial in zip(self.rings, self.initial_rings, strict=True):
            ring.copy_(initial)
        self.ring_start.zero_()
        self.replayed.fill_(REPLAYED)

    def forward(self, seed: Callable[[], torch.Tensor]) -> None:
        x_ring, b_ring, dt_ring = self.rings
        for layer in range(LAYERS):
            self._kernel(
                self.states[layer],
                x_ring[layer],
                b_ring[layer],
                dt_ring[layer],
                self.ring_start[layer],
                self.replayed[layer],
                self.x,
                self.dt,
                self.A,
                self.B,
                self.C,
                self.out,
                D=self.D,
                dt_bias=self.dt_bias,
                dt_softplus=True,
                state_batch_indices=self.slots,
                pad_slot_id=-1,
                rand_seed=seed(),
                philox_rounds=PHILOX_ROUNDS,
            )


@pytest.fixture(scope="module", params=["ssu", "replayssm"])
def layers(request: pytest.FixtureRequest) -> MambaLayers:
    device = torch.device("cuda", torch.cuda.current_device())
    if request.param == "ssu":
        model = MambaLayers(device)
    else:
        replay = pytest.importorskip(
            "flashinfer.mamba.checkpointing_ssu",
            reason="this FlashInfer has no ReplaySSM (checkpointing_ssu)",
        )
        sources = pytest.importorskip("flashinfer.jit.env").FLASHINFER_CSRC_DIR
        if not (sources / "checkpointing_ssu.cu").is_file():
            pytest.skip(
                f"{sources} lacks checkpointing_ssu.cu, which ReplaySSM's JIT build needs "
                "(a FlashInfer wheel trimmed to the plain SSU's sources)"
            )
        model = ReplaySsmLayers(device, replay.checkpointing_ssu)
    model.forward(lambda: torch.zeros(1, dtype=torch.int64, device=device))  # JIT build
    model.reset()
    return model


@pytest.fixture(params=[("reset", None), ("forward-context", None)], ids=lambda d: d[0])
def design(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """A design and its sync plan (None: the reset design's stream, the forward-context
    design's per_seed)."""
    return request.param


@pytest.fixture(params=["randint", "triton"])
def drawer(request: pytest.FixtureRequest) -> str:
    require_drawer(request.param)
    return request.param


def test_the_seed_changes_the_state(layers: MambaLayers) -> None:
    """Without this, equal states would prove nothing about the seeds."""
    results = []
    for value in (1, 2):
        layers.reset()
        layers.forward(lambda v=value: torch.full((1,), v, dtype=torch.int64, device="cuda"))
        results.append(layers.bits())
    assert not torch.equal(results[0], results[1])


def run_eager(runner: Runner, layers: MambaLayers) -> list[torch.Tensor]:
    states = []
    for _ in range(3):
        with runner.forward(DECODE):
            layers.forward(runner.seed)
        states.append(layers.bits())
    return states


def run_graph(runner: Runner, layers: MambaLayers) -> list[torch.Tensor]:
    """Captured as V1 captures, the forward begun before the capture; each replay inside
    a forward, which draws its seeds first (the reset design's)."""
    graph = torch.cuda.CUDAGraph()
    with runner.forward(FULL_GRAPH), torch.cuda.graph(graph):
        layers.forward(runner.seed)
    layers.reset()  # capture ran nothing, but start every arm from the same state
    states = []
    for _ in range(3):
        with runner.forward(FULL_GRAPH):
            graph.replay()
        states.append(layers.bits())
    return states


@pytest.mark.parametrize("run", [run_eager, run_graph], ids=["eager", "graph"])
def test_prefetched_seeds_give_stock_states(
    layers: MambaLayers, design: tuple[str, str | None], drawer: str, run
) -> None:
    if drawer == TRITON_DRAWER and design[0] != "reset":
        pytest.skip(OUTSIDE_GRAPHS_ONLY)
    results = []
    for which in (None, design[0]):
        runner = Runner(which, design[1], drawer, num_layers=LAYERS)
        layers.reset()
        torch.cuda.synchronize()
        torch.cuda.manual_seed(99)
        results.append(run(runner, layers))
    for step, (stock, ours) in enumerate(zip(*results, strict=True)):
        assert torch.equal(stock, ours), f"step {step}: the new fp16 state differs from stock's"
    assert not torch.equal(results[0][0], results[0][1]), "each step updates the state"
