# Lands in a vLLM source tree (not an installed vLLM) as
# tests/kernels/mamba/test_sr_seed_prefetch.py (vllm_patch/fork_test.py): for the
# forward-context design with the open_forward fixture of
# test_sr_seed_prefetch_forward_context.py; where the release has FlashInfer's
# ReplaySSM call, with test_sr_seed_prefetch_replayssm.py appended.

# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""VLLM_MAMBA_SR_SEED_PREFETCH: the seeds the Mamba SSU hands its kernel equal
stock's torch.randint draws, eagerly, beyond N calls, over CUDA graph replays
and outside a forward."""

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import torch

from vllm.config.mamba import MambaBackendEnum, MambaConfig
from vllm.model_executor.layers.mamba.ops import ssu_dispatch
from vllm.platforms import current_platform
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec

NUM_LAYERS = 8
SEED = 1234

OpenForward = Callable[..., AbstractContextManager[None]]
Replay = Callable[[torch.cuda.CUDAGraph, object], None]

pytestmark = pytest.mark.skipif(
    not current_platform.is_cuda(), reason="seed prefetching needs a CUDA device"
)


def _kv_cache_config(num_layers: int, draft_layers: int = 0) -> KVCacheConfig:
    # mamba_type is left at its default: Mamba-2. A draft model's layers are named
    # as vLLM's draft-model proposer loads them.
    spec = MambaSpec(block_size=16, shapes=((1,),), dtypes=(torch.float16,))
    layer_names = [f"model.layers.{i}.mixer" for i in range(num_layers)]
    layer_names += [f"draft_model.model.layers.{i}.mixer" for i in range(draft_layers)]
    return KVCacheConfig(
        num_blocks=1,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layer_names, spec)],
    )


def _mamba_config(backend: MambaBackendEnum) -> MambaConfig:
    return MambaConfig(
        backend=backend,
        enable_stochastic_rounding=True,
        stochastic_rounding_philox_rounds=5,
    )


@pytest.fixture
def initialize(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Initializes the SSU backend as the model runner does, with seed
    prefetching on or off; after the test, with it off."""
    backends: list[MambaBackendEnum] = []

    def init(
        backend: MambaBackendEnum, prefetch: bool, draft_layers: int = 0, **kwargs: Any
    ) -> None:
        if prefetch:
            monkeypatch.setenv("VLLM_MAMBA_SR_SEED_PREFETCH", "1")
        else:
            monkeypatch.delenv("VLLM_MAMBA_SR_SEED_PREFETCH", raising=False)
        ssu_dispatch.initialize_mamba_ssu_backend(
            _mamba_config(backend),
            _kv_cache_config(NUM_LAYERS, draft_layers),
            **kwargs,
        )
        backends.append(backend)

    yield init
    if backends:
        init(backends[-1], prefetch=False)


class _Decodes:
    """Attention metadata of a Mamba-2 layer in a batch with decode tokens."""

    num_decodes = 1


@pytest.fixture
def open_forward() -> OpenForward:
    """Opens a forward as the model runners do: inside sr_seed_forward, given
    attention metadata with decode tokens in the Mamba-2 layers."""
    decode = {f"model.layers.{i}.mixer": _Decodes() for i in range(NUM_LAYERS)}

    def forward(
        full_cudagraph: bool = False, captures: object = None
    ) -> AbstractContextManager[None]:
        return ssu_dispatch.sr_seed_forward(
            decode, full_cudagraph=full_cudagraph, captures=captures
        )

    return forward


@pytest.fixture
def replay(open_forward: OpenForward) -> Replay:
    """Replays a captured FULL graph as the runners do: V1 inside its forward
    (key None), V2 after sr_seed_replay(key); either draws the graph's seeds
    before it runs."""

    def run(graph: torch.cuda.CUDAGraph, key: object) -> None:
        if key is None:
            with open_forward(full_cudagraph=True):
                graph.replay()
        else:
            ssu_dispatch.sr_seed_replay(key)
            graph.replay()

    return run


class SeedRecorder:
    """A FlashInfer SSU kernel that records the rand_seed it is handed (a copy,
    as the kernel reads it: the next eager forward draws into the same buffer),
    with other work between calls as between layers."""

    def __init__(self) -> None:
        self.seeds: list[torch.Tensor] = []
        self.addresses: list[int] = []
        self.work = torch.ones(64, 64, device="cuda")
        # cuBLAS is initialized outside any graph capture.
        torch.tanh(self.work @ self.work)
        torch.accelerator.synchronize()

    def __call__(self, *args: Any, rand_seed: torch.Tensor, **kwargs: Any) -> None:
        self.work = torch.tanh(self.work @ self.work)
        self.seeds.append(rand_seed.clone())
        self.addresses.append(rand_seed.data_ptr())

    def values(self) -> list[int]:
        return [int(seed.item()) for seed in self.seeds]

    def prefetched(self, first: int, count: int) -> bool:
        """Whether calls first .. first + count - 1 read consecutive elements of
        one buffer: seeds drawn up front, not one tensor per inline draw."""
        addresses = self.addresses[first : first + count]
        return addresses == list(range(addresses[0], addresses[0] + 8 * count, 8))


SSUCalls = tuple[SeedRecorder, Callable[[int], None]]
SSU_CALLS = ["flashinfer_ssu"]
"""The fixtures of the SSU calls under test."""


@pytest.fixture
def flashinfer_ssu(
    monkeypatch: pytest.MonkeyPatch, initialize: Callable[..., None]
) -> SSUCalls:
    """A FlashInfer SSU backend over a recording kernel, with seed prefetching
    on, and the calls of `num_calls` Mamba-2 layers through it."""
    flashinfer_mamba = pytest.importorskip("flashinfer.mamba")
    recorder = SeedRecorder()
    monkeypatch.setattr(flashinfer_mamba, "selective_state_update", recorder)
    initialize(MambaBackendEnum.FLASHINFER, prefetch=True)
    backend = ssu_dispatch.FlashInferSSUBackend(
        _mamba_config(MambaBackendEnum.FLASHINFER)
    )
    args = [torch.zeros(1, device="cuda")] * 8

    def run_layers(num_calls: int) -> None:
        for _ in range(num_calls):
            backend(*args)

    return recorder, run_layers


@pytest.fixture(params=SSU_CALLS)
def ssu(request: pytest.FixtureRequest) -> SSUCalls:
    return request.getfixturevalue(request.param)


def _stock_seeds(num_seeds: int) -> list[int]:
    return [
        int(torch.randint(0, 2**32, (1,), device="cuda").item())
        for _ in range(num_seeds)
    ]


@pytest.mark.parametrize("extra_calls", [0, 3], ids=["n_calls", "beyond_n"])
def test_eager_forwards_match_stock(
    ssu: SSUCalls,
    open_forward: OpenForward,
    extra_calls: int,
) -> None:
    recorder, run_layers = ssu
    num_calls = NUM_LAYERS + extra_calls
    torch.manual_seed(SEED)
    stock = _stock_seeds(2 * num_calls)
    torch.manual_seed(SEED)
    # Two forwards: the second reuses the first one's seed buffer. Calls
    # beyond N draw inline, after the N prefetched seeds: stock's order.
    for _ in range(2):
        with open_forward():
            run_layers(num_calls)
    assert recorder.values() == stock
    assert recorder.values() != _stock_seeds(2 * num_calls)
    assert all(recorder.prefetched(f * num_calls, NUM_LAYERS) for f in range(2))
    if extra_calls:
        assert not recorder.prefetched(NUM_LAYERS, extra_calls)


def test_a_draft_models_mamba2_layers_are_not_counted(
    ssu: SSUCalls, initialize: Callable[..., None], open_forward: OpenForward
) -> None:
    """A draft model's Mamba-2 layers share the KV cache config, but its SSU calls
    run outside the model runner's forwards and draw inline: N counts the target
    model's layers, or each forward would leave seeds unconsumed and shift every
    later draw."""
    recorder, run_layers = ssu
    draft_layers = 2
    initialize(MambaBackendEnum.FLASHINFER, prefetch=True, draft_layers=draft_layers)
    steps = 2
    torch.manual_seed(SEED)
    stock = _stock_seeds(steps * (NUM_LAYERS + draft_layers))
    torch.manual_seed(SEED)
    for _ in range(steps):
        with open_forward():
            run_layers(NUM_LAYERS)
        run_layers(draft_layers)  # the proposer's forward
    assert recorder.values() == stock


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_cuda_graph_capture_and_three_replays(
    ssu: SSUCalls,
    open_forward: OpenForward,
    replay: Replay,
    runner: str,
) -> None:
    """V1 captures inside the runner's forward, V2 opens the forward inside the
    capture; both replay with no Python forward of the model."""
    recorder, run_layers = ssu
    torch.manual_seed(SEED)
    stock_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(stock_graph):
        stock = [
            torch.randint(0, 2**32, (1,), device="cuda") for _ in range(NUM_LAYERS)
        ]
    stock_replays = []
    for _ in range(3):
        stock_graph.replay()
        stock_replays.append([int(seed.item()) for seed in stock])

    torch.manual_seed(SEED)
    graph = torch.cuda.CUDAGraph()
    key = None if runner == "v1" else ("FULL", NUM_LAYERS)
    if key is None:
        with open_forward(full_cudagraph=True), torch.cuda.graph(graph):
            run_layers(NUM_LAYERS)
    else:
        with torch.cuda.graph(graph), open_forward(captures=key):
            run_layers(NUM_LAYERS)
    replays = []
    for _ in range(3):
        replay(graph, key)
        replays.append(recorder.values())

    assert replays == stock_replays
    assert recorder.prefetched(0, NUM_LAYERS)
    # Each replay reads fresh seeds, as stock's captured randint draws them.
    assert replays[0] != replays[1] != replays[2]


def test_fallback_outside_a_forward(
    ssu: SSUCalls,
) -> None:
    recorder, run_layers = ssu
    torch.manual_seed(SEED)
    stock = _stock_seeds(NUM_LAYERS)
    torch.manual_seed(SEED)
    run_layers(NUM_LAYERS)
    assert recorder.values() == stock
    assert not recorder.prefetched(0, NUM_LAYERS)


@pytest.mark.skipif(
    not current_platform.is_device_capability_family(100),
    reason="the Triton SSU rounds stochastically with cvt.rs, which only "
    "Blackwell (compute capability 10.x) has",
)
def test_triton_fp16_state_matches_stock(
    initialize: Callable[..., None], open_forward: OpenForward
) -> None:
    """The Triton kernel: NUM_LAYERS calls' fp16 states with prefetched seeds
    equal stock's bit for bit; stock under another generator seed does not."""
    gen = torch.Generator(device="cuda").manual_seed(7)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda")

    # Per layer: batch 2, 4 heads x 16 x 32 state, 1 group.
    layers = [
        dict(
            state=randn(2, 4, 16, 32).half(),
            x=randn(2, 4, 16),
            dt=randn(2, 4, 16),
            A=-randn(4, 16, 32).abs(),
            B=randn(2, 1, 32),
            C=randn(2, 1, 32),
            D=randn(4, 16),
            dt_bias=randn(4, 16),
        )
        for _ in range(NUM_LAYERS)
    ]

    def states(prefetch: bool, generator_seed: int) -> list[torch.Tensor]:
        initialize(MambaBackendEnum.TRITON, prefetch=prefetch)
        backend = ssu_dispatch.get_mamba_ssu_backend()
        results = []
        torch.manual_seed(generator_seed)
        with open_forward() if prefetch else contextlib.nullcontext():
            for layer in layers:
                state = layer["state"].clone()
                out = torch.empty_like(layer["x"])
                backend(
                    state,
                    layer["x"],
                    layer["dt"],
                    layer["A"],
                    layer["B"],
                    layer["C"],
                    layer["D"],
                    layer["dt_bias"],
                    dt_softplus=True,
                    out=out,
                    is_blackwell=True,
                )
                results.append(state.view(torch.int16))
        torch.accelerator.synchronize()
        return results

    stock = states(prefetch=False, generator_seed=SEED)
    prefetched = states(prefetch=True, generator_seed=SEED)
    other = states(prefetch=False, generator_seed=SEED + 1)
    for layer, (want, got) in enumerate(zip(stock, prefetched, strict=True)):
        assert torch.equal(got, want), layer
    assert not any(torch.equal(o, w) for o, w in zip(other, stock, strict=True))
