"""The real FlashInfer SSU's new state with prefetched seeds equals stock's, bit for bit.

Stochastic rounding makes the fp16 state depend on the seed; these tests run
the SSU of several layers with stock's inline seeds and with each design's
prefetched seeds, eagerly and over CUDA-graph replays, and compare the states'
raw bits.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from runner_hooks import SYNC_PLANS

from .harness import DECODE, FULL_GRAPH, Runner, require_drawer

pytestmark = pytest.mark.gpu
ssu = pytest.importorskip("flashinfer.mamba", reason="needs FlashInfer").selective_state_update

LAYERS, BATCH, HEADS, HEAD_DIM, STATE, GROUPS = 6, 4, 8, 64, 128, 2
PHILOX_ROUNDS = 5


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


@pytest.fixture(scope="module")
def layers() -> MambaLayers:
    model = MambaLayers(torch.device("cuda", torch.cuda.current_device()))
    model.forward(lambda: torch.zeros(1, dtype=torch.int64, device=model.x.device))  # JIT build
    return model


@pytest.fixture(params=[("reset", plan) for plan in sorted(SYNC_PLANS)] + [("baseline", None)])
def design(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    return request.param


@pytest.fixture(params=["randint", "kernel"])
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
