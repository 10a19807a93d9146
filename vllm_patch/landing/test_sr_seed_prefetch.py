# Lands in a vLLM source tree (not an installed vLLM) as
# tests/kernels/mamba/test_sr_seed_prefetch.py: as it is for the reset design; for the
# forward-context design, with the open_forward fixture replaced by that of
# test_sr_seed_prefetch_forward_context.py, and its import added
# (vllm_patch/fork_test.py).

# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""VLLM_MAMBA_SR_SEED_PREFETCH: the seeds the FlashInfer and Triton SSU
backends (and ReplaySSM's calls, in a vLLM that has them) hand their kernels
equal stock's torch.randint draws, eagerly, beyond N calls, over CUDA graph
replays, and outside a forward; on Blackwell, the Triton kernel's fp16 states
equal stock's bit for bit."""

import contextlib
import importlib
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, cast

import pytest
import torch

from vllm.config.mamba import MambaBackendEnum, MambaConfig
from vllm.model_executor.layers.mamba.ops import mamba_ssm, ssu_dispatch
from vllm.platforms import current_platform
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec

NUM_LAYERS = 8
SEED = 1234

OpenForward = Callable[..., AbstractContextManager[None]]

pytestmark = pytest.mark.skipif(
    not current_platform.is_cuda(), reason="seed prefetching needs a CUDA device"
)


def _kv_cache_config(num_layers: int) -> KVCacheConfig:
    # mamba_type is left at its default, Mamba-2 (named "mamba2" before 0.21.0).
    spec = MambaSpec(block_size=16, shapes=((1,),), dtypes=(torch.float16,))
    layer_names = [f"model.layers.{i}.mixer" for i in range(num_layers)]
    return KVCacheConfig(
        num_blocks=1,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layer_names, spec)],
    )


TRITON_REPLAYSSM = (
    "vllm.model_executor.layers.mamba.ops.selective_state_update_replayssm_output_only"
)


def _triton_replayssm() -> Any:
    """The Triton ReplaySSM module of vLLM (0.27.0 on)."""
    return importlib.import_module(TRITON_REPLAYSSM)


def triton_replayssm_arguments(device: str) -> tuple[list[Any], dict[str, Any]]:
    """Arguments of a Triton ReplaySSM call that its wrapper's checks accept:
    2 heads x 4 x 8 state, 1 group, a window of 4; dt, A and dt_bias one value
    per head, as MambaMixer2 passes them."""
    nheads, dim, dstate, window = 2, 4, 8, 4
    x = torch.zeros(1, nheads, dim, device=device)
    args = [
        torch.zeros(1, nheads, dim, dstate, dtype=torch.float16, device=device),
        x,
        torch.zeros(1, nheads, 1, device=device).expand(1, nheads, dim),
        torch.zeros(nheads, 1, 1, device=device).expand(nheads, dim, dstate),
        torch.zeros(1, 1, dstate, device=device),
        torch.zeros(1, 1, dstate, device=device),
        torch.zeros(nheads, dim, device=device),
        torch.zeros(nheads, 1, device=device).expand(nheads, dim),
    ]
    kwargs = dict(
        x_cache=torch.zeros(1, nheads, window, dim, device=device),
        dt_cache=torch.zeros(1, nheads, window, device=device),
        B_cache=torch.zeros(1, 1, window, dstate, device=device),
        bc_pre=torch.zeros(1, 1, window, device=device),
        write_pos=torch.zeros(1, dtype=torch.int32, device=device),
        is_flush=torch.zeros(1, dtype=torch.bool, device=device),
        max_cache_len=window,
        out=torch.zeros_like(x),
    )
    return args, kwargs


def _stock_seeds(num_seeds: int) -> list[int]:
    return [
        int(torch.randint(0, 2**32, (1,), device="cuda").item())
        for _ in range(num_seeds)
    ]


class NoLaunch:
    """A Triton kernel that launches nothing (ReplaySSM's precompute kernel)."""

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class SSUHarness:
    """Makes a Mamba-2 layer's SSU call on `path` as vLLM does, with other work
    between calls as between layers; the GPU kernel is replaced by a recorder
    of its rand_seed (FlashInfer's kernel; for Triton, the Triton kernel that
    stock's wrapper launches, after its own seed handling).

    path: "flashinfer" and "triton" call the SSU backend; "flashinfer-replayssm"
    ssu_dispatch's ReplaySSM function; "triton-replayssm" the Triton ReplaySSM
    wrapper as MambaMixer2 calls it, with the prefetched seed.
    """

    def __init__(self, backend: ssu_dispatch.MambaSSUBackend, path: str) -> None:
        self.backend = backend
        self.path = path
        self.seeds: list[torch.Tensor] = []
        self.taken: list[bool] = []
        self.work = torch.ones(64, 64, device="cuda")
        self.kwargs: dict[str, Any] = {}
        if path == "triton-replayssm":
            self.args, self.kwargs = triton_replayssm_arguments("cuda")
        elif path == "flashinfer-replayssm":
            # FlashInfer's ReplaySSM call as MambaMixer2 makes it: state, x, dt,
            # A, B, C, out (x-shaped where it reshapes them), the ring buffers
            # and trackers (left alone: update_trackers=False).
            x, other = (
                torch.zeros(1, 2, 4, device="cuda"),
                torch.zeros(1, device="cuda"),
            )
            self.args = [other, x, x, other, x, x, x] + [other] * 6
        elif isinstance(backend, ssu_dispatch.FlashInferSSUBackend):
            self.args = [torch.zeros(1, device="cuda")] * 8
        else:
            # What selective_state_update checks: 2 heads x 4 x 8 state, 1 group.
            x = torch.zeros(1, 2, 4, device="cuda")
            self.args = [
                torch.zeros(1, 2, 4, 8, device="cuda", dtype=torch.float16),
                x,
                torch.zeros_like(x),
                torch.zeros(2, 4, 8, device="cuda"),
                torch.zeros(1, 1, 8, device="cuda"),
                torch.zeros(1, 1, 8, device="cuda"),
                torch.zeros(2, 4, device="cuda"),
                torch.zeros(2, 4, device="cuda"),
            ]
            self.out = torch.zeros_like(x)
        # Initialise cuBLAS outside any graph capture.
        torch.tanh(self.work @ self.work)
        torch.accelerator.synchronize()

    def kernel(self, *args: Any, rand_seed: torch.Tensor, **kwargs: Any) -> None:
        # A copy, read as the kernel would read it: the next eager forward
        # draws into the same buffer.
        self.seeds.append(rand_seed.clone())

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        """The Triton kernel's launch: `_selective_scan_update_kernel[grid](...)`."""

        def launch(state: torch.Tensor, rand_seed: torch.Tensor, *args: Any, **kw: Any):
            self.kernel(rand_seed=rand_seed)

        return launch

    def run_layers(self, num_calls: int) -> None:
        for _ in range(num_calls):
            self.work = torch.tanh(self.work @ self.work)
            if self.path == "triton-replayssm":
                _triton_replayssm().selective_state_update_replayssm_output_only(
                    *self.args,
                    **self.kwargs,
                    enable_stochastic_rounding=True,
                    cache_philox_rounds=5,
                    rand_seed=ssu_dispatch._prefetched_sr_seed(),
                )
            elif self.path == "flashinfer-replayssm":
                # Any: the positional arguments' count differs from path to path.
                cast(Any, ssu_dispatch.selective_state_update_replayssm_flashinfer)(
                    *self.args,
                    logical_window=4,
                    update_trackers=False,
                    enable_stochastic_rounding=True,
                    stochastic_rounding_philox_rounds=5,
                )
            elif isinstance(self.backend, ssu_dispatch.FlashInferSSUBackend):
                self.backend(*self.args)
            else:
                cast(Any, self.backend)(*self.args, out=self.out)

    def seed_values(self) -> list[int]:
        return [int(seed.item()) for seed in self.seeds]


class CountingPrefetcher:
    """Passes everything on to the attached prefetcher, noting which of its
    next_seed() calls had a prefetched seed."""

    def __init__(self, prefetcher: Any, taken: list[bool]) -> None:
        self._prefetcher = prefetcher
        self._taken = taken

    def next_seed(self) -> torch.Tensor | None:
        seed = self._prefetcher.next_seed()
        self._taken.append(seed is not None)
        return seed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._prefetcher, name)


@pytest.fixture(
    params=["flashinfer", "triton", "flashinfer-replayssm", "triton-replayssm"]
)
def harness(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> SSUHarness:
    path = request.param
    backend_name, _, replayssm = path.partition("-")
    if path == "flashinfer-replayssm" and not hasattr(
        ssu_dispatch, "selective_state_update_replayssm_flashinfer"
    ):
        pytest.skip("this vLLM has no FlashInfer ReplaySSM (added in 0.30.0)")
    if path == "triton-replayssm":
        try:
            _triton_replayssm()
        except ModuleNotFoundError as error:
            if error.name != TRITON_REPLAYSSM:
                raise
            pytest.skip("this vLLM has no Triton ReplaySSM (added in 0.27.0)")
    # use_replayssm: where initialize_mamba_ssu_backend takes it (0.30.0 on).
    takes_replayssm = (
        "use_replayssm"
        in inspect.signature(ssu_dispatch.initialize_mamba_ssu_backend).parameters
    )
    monkeypatch.setenv("VLLM_MAMBA_SR_SEED_PREFETCH", "1")
    monkeypatch.setattr(ssu_dispatch, "_mamba_ssu_backend", None)
    monkeypatch.setattr(ssu_dispatch, "_sr_seed_prefetcher", None)
    with monkeypatch.context() as blackwell:
        if backend_name == "triton":
            # MambaConfig refuses Triton stochastic rounding below Blackwell
            # (its kernel's cvt.rs); the kernel is replaced below, so here the
            # GPU passes for one while the backend is set up.
            blackwell.setattr(
                current_platform,
                "is_device_capability_family",
                lambda family, device_id=0: family == 100,
            )
        mamba_config = MambaConfig(
            backend=MambaBackendEnum(backend_name),
            enable_stochastic_rounding=True,
            stochastic_rounding_philox_rounds=5,
        )
        ssu_dispatch.initialize_mamba_ssu_backend(
            mamba_config,
            _kv_cache_config(NUM_LAYERS),
            **({"use_replayssm": True} if replayssm and takes_replayssm else {}),
        )
    prefetcher = ssu_dispatch._sr_seed_prefetcher
    assert prefetcher is not None, "the prefetcher did not engage"
    backend = ssu_dispatch.get_mamba_ssu_backend()
    harness = SSUHarness(backend, path)
    if path == "triton-replayssm":
        module = _triton_replayssm()
        monkeypatch.setattr(
            module, "_replayssm_output_only_precompute_kernel", NoLaunch()
        )
        monkeypatch.setattr(module, "_replayssm_output_only_kernel", harness)
    elif path == "flashinfer-replayssm":
        monkeypatch.setattr(
            ssu_dispatch, "_flashinfer_replayssm_kernel", harness.kernel
        )
    elif isinstance(backend, ssu_dispatch.FlashInferSSUBackend):
        monkeypatch.setattr(backend, "_kernel", harness.kernel)
    else:
        # Stock's selective_state_update runs, its seed handling included; the
        # Triton kernel (whose stochastic rounding needs Blackwell's cvt.rs)
        # is replaced by the recorder.
        monkeypatch.setattr(mamba_ssm, "_selective_scan_update_kernel", harness)
    counting = CountingPrefetcher(prefetcher, harness.taken)
    monkeypatch.setattr(ssu_dispatch, "_sr_seed_prefetcher", counting)
    return harness


@pytest.fixture
def open_forward() -> OpenForward:
    """Opens a forward as the model runners do: inside sr_seed_forward, given
    attention metadata with decode tokens in the Mamba-2 layers."""

    class DecodeMetadata:
        num_decodes = 1

    decode = {f"model.layers.{i}.mixer": DecodeMetadata() for i in range(NUM_LAYERS)}

    def forward(full_cudagraph: bool = False) -> AbstractContextManager[None]:
        return ssu_dispatch.sr_seed_forward(decode, full_cudagraph=full_cudagraph)

    return forward


@pytest.mark.parametrize("extra_calls", [0, 3], ids=["n_calls", "beyond_n"])
def test_eager_forwards_match_stock(
    harness: SSUHarness, open_forward: OpenForward, extra_calls: int
) -> None:
    num_calls = NUM_LAYERS + extra_calls
    torch.manual_seed(SEED)
    stock = _stock_seeds(2 * num_calls)
    torch.manual_seed(SEED)
    # Two forwards: the second reuses the first one's seed buffer.
    for _ in range(2):
        with open_forward():
            harness.run_layers(num_calls)
    assert harness.seed_values() == stock
    # Calls beyond N draw inline, after the N prefetched seeds: stock order.
    assert harness.taken == ([True] * NUM_LAYERS + [False] * extra_calls) * 2


def test_cuda_graph_capture_and_three_replays(
    harness: SSUHarness, open_forward: OpenForward
) -> None:
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
    with open_forward(full_cudagraph=True), torch.cuda.graph(graph):
        harness.run_layers(NUM_LAYERS)
    replays = []
    for _ in range(3):
        graph.replay()
        replays.append(harness.seed_values())

    assert harness.taken == [True] * NUM_LAYERS
    assert replays == stock_replays
    # Each replay draws fresh seeds, as stock's captured randint does.
    assert replays[0] != replays[1] != replays[2]


def test_fallback_outside_a_forward(harness: SSUHarness) -> None:
    torch.manual_seed(SEED)
    stock = _stock_seeds(NUM_LAYERS)
    torch.manual_seed(SEED)
    harness.run_layers(NUM_LAYERS)
    assert harness.seed_values() == stock
    assert harness.taken == [False] * NUM_LAYERS


BLACKWELL = current_platform.is_cuda() and current_platform.is_device_capability_family(
    100
)


@pytest.mark.skipif(
    not BLACKWELL,
    reason="the Triton SSU rounds stochastically with cvt.rs, which only "
    "Blackwell (compute capability 10.x) has",
)
def test_triton_fp16_state_matches_stock(
    monkeypatch: pytest.MonkeyPatch, open_forward: OpenForward
) -> None:
    """The real Triton kernel: NUM_LAYERS calls' fp16 states with prefetched
    seeds equal stock's bit for bit; stock under another generator seed does
    not (the check can fail)."""
    monkeypatch.setenv("VLLM_MAMBA_SR_SEED_PREFETCH", "1")
    monkeypatch.setattr(ssu_dispatch, "_mamba_ssu_backend", None)
    monkeypatch.setattr(ssu_dispatch, "_sr_seed_prefetcher", None)
    ssu_dispatch.initialize_mamba_ssu_backend(
        MambaConfig(
            backend=MambaBackendEnum.TRITON,
            enable_stochastic_rounding=True,
            stochastic_rounding_philox_rounds=5,
        ),
        _kv_cache_config(NUM_LAYERS),
    )
    prefetcher = ssu_dispatch._sr_seed_prefetcher
    assert prefetcher is not None, "the prefetcher did not engage"
    backend = ssu_dispatch.get_mamba_ssu_backend()
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

    def states(prefetched: bool, generator_seed: int) -> list[torch.Tensor]:
        monkeypatch.setattr(
            ssu_dispatch, "_sr_seed_prefetcher", prefetcher if prefetched else None
        )
        results = []
        torch.manual_seed(generator_seed)
        with open_forward() if prefetched else contextlib.nullcontext():
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
                results.append(state)
        torch.accelerator.synchronize()
        return results

    stock = states(prefetched=False, generator_seed=SEED)
    prefetched = states(prefetched=True, generator_seed=SEED)
    other = states(prefetched=False, generator_seed=SEED + 1)
    for layer, (want, got) in enumerate(zip(stock, prefetched, strict=True)):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), layer
    assert not any(
        torch.equal(o.view(torch.int16), w.view(torch.int16))
        for o, w in zip(other, stock, strict=True)
    )
