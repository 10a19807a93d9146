"""The patched envs.py, ssu_dispatch.py, the Triton kernels' wrappers and their ReplaySSM
call, run for real on the CPU (both designs)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import vllm.envs as envs
from vllm.config.mamba import MambaBackendEnum, MambaConfig
from vllm.model_executor.layers.mamba.ops import ssu_dispatch
from vllm.platforms import current_platform

from tests.vllm_patch.patched.conftest import (
    DESIGN,
    TREE,
    KernelStandIn,
    at_least,
    kv_cache_config,
    only_in,
    since,
)
from vllm_patch import fork_test

NUM_LAYERS = 5


def test_the_env_var_defaults_off_and_keeps_the_compile_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Toggling it changes no compile factor, so the torch.compile cache is kept."""
    assert envs.VLLM_MAMBA_SR_SEED_PREFETCH is False
    off = envs.compile_factors()
    assert "VLLM_MAMBA_SR_SEED_PREFETCH" not in off
    monkeypatch.setenv("VLLM_MAMBA_SR_SEED_PREFETCH", "1")
    assert envs.VLLM_MAMBA_SR_SEED_PREFETCH is True
    assert envs.compile_factors() == off


def mamba_config(**overrides: Any) -> MambaConfig:
    settings: dict[str, Any] = {
        "backend": MambaBackendEnum.FLASHINFER,
        "enable_stochastic_rounding": True,
        "stochastic_rounding_philox_rounds": 5,
    }
    return MambaConfig(**{**settings, **overrides})


@pytest.fixture
def engaged(
    kernel: KernelStandIn,
    cuda_platform: None,
    prefetcher_spy: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> list[int]:
    """Every condition holds; returns the spy on the prefetcher's construction."""
    monkeypatch.setenv("VLLM_MAMBA_SR_SEED_PREFETCH", "1")
    return prefetcher_spy


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The lines ssu_dispatch logs once (the engagement line, or why not), as they read."""
    lines: list[str] = []
    for once in ("info_once", "warning_once"):
        monkeypatch.setattr(
            ssu_dispatch.logger, once, lambda msg, *args, **kw: lines.append(msg % args)
        )
    return lines


def test_it_engages_when_every_condition_holds_with_n_mamba2_layers(
    engaged: list[int], logged: list[str]
) -> None:
    ssu_dispatch.initialize_mamba_ssu_backend(mamba_config(), kv_cache_config(mamba2=NUM_LAYERS))
    assert engaged == [NUM_LAYERS]
    assert ssu_dispatch._sr_seed_prefetcher is not None
    # No CUDA device here: the prefetcher is attached but draws nothing ahead.
    how = "" if DESIGN == "reset" else f"{DESIGN} design, "
    inactive = "" if DESIGN == "reset" else ", inactive: no CUDA device"
    assert [line for line in logged if "seeds" in line] == [
        f"Prefetching Mamba stochastic-rounding seeds for {NUM_LAYERS} layers per forward "
        f"({how}flashinfer SSU{inactive})."
    ]
    # Initialised again (memory profiling, then the real KV cache): kept for as
    # many layers (in the reset design, with the buffer its graphs read), else
    # replaced.
    first = ssu_dispatch._sr_seed_prefetcher
    ssu_dispatch.initialize_mamba_ssu_backend(mamba_config(), kv_cache_config(mamba2=NUM_LAYERS))
    if DESIGN == "reset":
        assert ssu_dispatch._sr_seed_prefetcher is first and engaged == [NUM_LAYERS]
    else:
        assert engaged == [NUM_LAYERS, NUM_LAYERS]
    ssu_dispatch.initialize_mamba_ssu_backend(mamba_config(), kv_cache_config(mamba2=3))
    assert engaged[-1] == 3 and ssu_dispatch._sr_seed_prefetcher is not first


def test_n_counts_the_target_models_mamba2_layers_not_a_draft_models(
    engaged: list[int], logged: list[str]
) -> None:
    """A draft model's Mamba-2 layers share the KV cache config but not the runner's
    forwards: N counted with them would leave seeds unconsumed every forward, and every
    later draw would shift."""
    config = kv_cache_config(mamba2=NUM_LAYERS, draft_mamba2=2)
    assert sum(len(group.layer_names) for group in config.kv_cache_groups) == NUM_LAYERS + 2
    ssu_dispatch.initialize_mamba_ssu_backend(mamba_config(), config)
    assert engaged == [NUM_LAYERS]
    if DESIGN == "reset":
        assert ssu_dispatch._mamba2_probe_layer == "model.layers.0.mixer2"


OFF_CASES = {
    "env_var_unset": None,
    "stochastic_rounding_off": "stochastic rounding is off",
    "moe_routing_simulation": "VLLM_MOE_ROUTING_SIMULATION_STRATEGY is set",
    "not_cuda": "the platform is not CUDA",
    "mamba1_layers": "the model has Mamba-1 layers",
}


@pytest.mark.parametrize("case", sorted(OFF_CASES))
def test_each_condition_turns_it_off(
    engaged: list[int],
    case: str,
    logged: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = mamba_config(enable_stochastic_rounding=case != "stochastic_rounding_off")
    kv_config = kv_cache_config(mamba2=NUM_LAYERS, mamba1=2 if case == "mamba1_layers" else 0)
    if case == "env_var_unset":
        monkeypatch.delenv("VLLM_MAMBA_SR_SEED_PREFETCH")
    if case == "not_cuda":
        monkeypatch.setattr(current_platform, "is_cuda", lambda: False)
    if case == "moe_routing_simulation":
        monkeypatch.setenv("VLLM_MOE_ROUTING_SIMULATION_STRATEGY", "uniform_random")
    ssu_dispatch.initialize_mamba_ssu_backend(config, kv_config)
    assert engaged == []
    unused = [f"VLLM_MAMBA_SR_SEED_PREFETCH is set but unused: {OFF_CASES[case]}."]
    assert [line for line in logged if "SEED" in line] == (
        [] if case == "env_var_unset" else unused
    )
    assert ssu_dispatch._sr_seed_prefetcher is None
    if case != "env_var_unset":  # the gate is asked only with the variable set
        assert ssu_dispatch._sr_seed_prefetch_blocker(config, kv_config) == OFF_CASES[case]


def _triton_stand_in(monkeypatch: pytest.MonkeyPatch) -> type:
    """TritonSSUBackend without its Triton kernel (no Triton on this machine)."""

    class TritonStandIn(ssu_dispatch.TritonSSUBackend):
        def __init__(self, mamba_config: MambaConfig) -> None:
            ssu_dispatch.MambaSSUBackend.__init__(self, mamba_config)

    monkeypatch.setitem(ssu_dispatch._BACKEND_REGISTRY, MambaBackendEnum.TRITON, TritonStandIn)
    return TritonStandIn


def call_ssu(state: torch.Tensor | None = None) -> None:
    state = torch.zeros(1) if state is None else state
    ssu_dispatch.get_mamba_ssu_backend()(*[state] * 8)


class FixedPrefetcher:
    """Stands in for an attached prefetcher: hands out the given seeds, then None."""

    def __init__(self, *seeds: torch.Tensor | None) -> None:
        self.seeds = list(seeds)

    def next_seed(self) -> torch.Tensor | None:
        return self.seeds.pop(0)


def stock_seed_after(seed: int) -> int:
    torch.manual_seed(seed)
    return int(torch.randint(0, 2**32, (1,)).item())


def prefetched_then_inline(
    call: Callable[[], None], kernel: KernelStandIn, monkeypatch: pytest.MonkeyPatch
) -> torch.Tensor:
    """With a prefetcher that hands out one seed, then None: the first call's
    kernel gets that seed, the second stock's inline draw (checked against
    stock's value); returns the second call's seed tensor."""
    prefetched = torch.tensor([7], dtype=torch.int64)
    monkeypatch.setattr(ssu_dispatch, "_sr_seed_prefetcher", FixedPrefetcher(prefetched, None))
    call()
    assert kernel.calls[-1]["rand_seed"] is prefetched
    expected = stock_seed_after(11)
    torch.manual_seed(11)
    call()
    inline = kernel.calls[-1]["rand_seed"]
    assert inline.dtype == torch.int64 and int(inline.item()) == expected
    return inline


def test_the_kernel_receives_the_prefetched_seed_or_an_inline_stock_one(
    engaged: list[int],
    kernel: KernelStandIn,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ssu_dispatch.initialize_mamba_ssu_backend(mamba_config(), kv_cache_config(mamba2=2))
    inline = prefetched_then_inline(call_ssu, kernel, monkeypatch)
    assert inline.shape == (1,)

    monkeypatch.setattr(ssu_dispatch, "_sr_seed_prefetcher", None)
    torch.manual_seed(11)
    call_ssu()
    assert int(kernel.calls[-1]["rand_seed"].item()) == stock_seed_after(11)
    # The rest of the kernel call is stock's.
    assert kernel.calls[-1]["philox_rounds"] == 5
    assert kernel.calls[-1]["cache_steps"] == 0
    # The kernel's algorithm= (MambaSSUAlgorithm) arrived in 0.27.0.
    assert kernel.calls[-1].get("algorithm") == ("auto" if at_least("0.27.0") else None)


def test_no_seed_at_all_without_stochastic_rounding(
    kernel: KernelStandIn, cuda_platform: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = mamba_config(enable_stochastic_rounding=False)
    ssu_dispatch.initialize_mamba_ssu_backend(config, kv_cache_config(mamba2=2))
    monkeypatch.setattr(ssu_dispatch, "_sr_seed_prefetcher", FixedPrefetcher(torch.ones(1)))
    call_ssu()
    assert kernel.calls[-1]["rand_seed"] is None


def test_the_real_prefetcher_without_a_cuda_device_draws_inline(
    engaged: list[int], kernel: KernelStandIn
) -> None:
    ssu_dispatch.initialize_mamba_ssu_backend(mamba_config(), kv_cache_config(mamba2=2))
    assert ssu_dispatch._sr_seed_prefetcher is not None
    expected = stock_seed_after(3)
    torch.manual_seed(3)
    call_ssu()
    assert int(kernel.calls[-1]["rand_seed"].item()) == expected


def test_it_engages_with_the_triton_backend(
    engaged: list[int], logged: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _triton_stand_in(monkeypatch)
    config = mamba_config(backend=MambaBackendEnum.TRITON)
    ssu_dispatch.initialize_mamba_ssu_backend(config, kv_cache_config(mamba2=NUM_LAYERS))
    assert engaged == [NUM_LAYERS]
    assert [line for line in logged if "seeds" in line and "triton SSU" in line], logged


def test_the_triton_backend_hands_its_kernel_the_prefetched_seed_or_none(
    engaged: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """None: stock's selective_state_update then draws inline, as stock."""
    recorded = KernelStandIn()
    backend_cls = _triton_stand_in(monkeypatch)
    monkeypatch.setattr(backend_cls, "_kernel", recorded, raising=False)
    config = mamba_config(backend=MambaBackendEnum.TRITON)
    ssu_dispatch.initialize_mamba_ssu_backend(config, kv_cache_config(mamba2=2))
    prefetched = torch.tensor([7], dtype=torch.int64)
    monkeypatch.setattr(ssu_dispatch, "_sr_seed_prefetcher", FixedPrefetcher(prefetched, None))
    call_ssu()
    assert recorded.calls[-1]["rand_seed"] is prefetched
    call_ssu()
    assert recorded.calls[-1]["rand_seed"] is None
    monkeypatch.setattr(ssu_dispatch, "_sr_seed_prefetcher", None)
    call_ssu()
    assert recorded.calls[-1]["rand_seed"] is None
    assert recorded.calls[-1]["enable_stochastic_rounding"] is True


def call_replayssm(enable_stochastic_rounding: bool = True) -> None:
    """FlashInfer's ReplaySSM call as MambaMixer2 makes it, on small CPU tensors
    (its kernel is the stand-in; the ring trackers are left alone)."""
    x, other = torch.zeros(1, 2, 4), torch.zeros(1)
    ssu_dispatch.selective_state_update_replayssm_flashinfer(
        # state, x, dt, A, B, C, out, then the ring buffers and trackers
        *(other, x, x, other, x, x, x),
        *[other] * 6,
        logical_window=4,
        update_trackers=False,
        enable_stochastic_rounding=enable_stochastic_rounding,
        stochastic_rounding_philox_rounds=5,
    )


@since("0.30.0", "ReplaySSM")
def test_flashinfer_replayssm_takes_the_prefetched_seed_or_draws_as_stock(
    engaged: list[int],
    kernel: KernelStandIn,
    logged: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ssu_dispatch.initialize_mamba_ssu_backend(
        mamba_config(), kv_cache_config(mamba2=NUM_LAYERS), use_replayssm=True
    )
    assert engaged == [NUM_LAYERS]
    assert [line for line in logged if "flashinfer ReplaySSM" in line], logged
    # None for the second call (beyond N, outside a forward): stock's inline draw.
    prefetched_then_inline(call_replayssm, kernel, monkeypatch)
    monkeypatch.setattr(ssu_dispatch, "_sr_seed_prefetcher", None)
    call_replayssm(enable_stochastic_rounding=False)
    assert kernel.calls[-1]["rand_seed"] is None
    assert kernel.calls[-1]["philox_rounds"] == 5


class LaunchStandIn:
    """Stands in for the Triton kernel object: `kernel[grid](*args, **kwargs)` records args."""

    def __init__(self) -> None:
        self.seeds: list[torch.Tensor | None] = []

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(state: torch.Tensor, rand_seed: torch.Tensor | None, *args: Any, **kw: Any):
            self.seeds.append(rand_seed)

        return launch


def test_selective_state_update_draws_only_when_no_seed_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.model_executor.layers.mamba.ops import mamba_ssm

    launches = LaunchStandIn()
    monkeypatch.setattr(mamba_ssm, "_selective_scan_update_kernel", launches)
    monkeypatch.setattr(mamba_ssm, "try_get_optimal_ssm_config", lambda *a, **kw: (4, 1))
    nheads, dim, dstate = 2, 4, 8

    def run(**extra: Any) -> None:
        x = torch.zeros(1, nheads, dim)
        mamba_ssm.selective_state_update(
            torch.zeros(1, nheads, dim, dstate, dtype=torch.float16),
            x,
            torch.zeros_like(x),
            torch.zeros(nheads, dim, dstate),
            torch.zeros(1, 1, dstate),
            torch.zeros(1, 1, dstate),
            torch.zeros(nheads, dim),
            torch.zeros(nheads, dim),
            out=torch.zeros_like(x),
            **extra,
        )

    given = torch.tensor([5], dtype=torch.int64)
    torch.manual_seed(11)
    run(enable_stochastic_rounding=True, rand_seed=given)
    assert launches.seeds[-1] is given
    run(enable_stochastic_rounding=True)  # stock: drawn here, from where the given seed left it
    assert int(launches.seeds[-1].item()) == stock_seed_after(11)
    run()
    assert launches.seeds[-1] is None


@since("0.30.0", "ReplaySSM as initialize_mamba_ssu_backend's use_replayssm")
def test_it_engages_with_replayssm_on_the_triton_backend(
    engaged: list[int], logged: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """mamba_mixer2.py's Triton ReplaySSM call takes the prefetched seed too."""
    _triton_stand_in(monkeypatch)
    config = mamba_config(backend=MambaBackendEnum.TRITON)
    ssu_dispatch.initialize_mamba_ssu_backend(
        config, kv_cache_config(mamba2=NUM_LAYERS), use_replayssm=True
    )
    assert engaged == [NUM_LAYERS]
    assert [line for line in logged if "triton ReplaySSM" in line], logged


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


def run_triton_replayssm(monkeypatch: pytest.MonkeyPatch, **extra: Any) -> list[Any]:
    """The Triton ReplaySSM kernel's wrapper on small CPU tensors, its two Triton
    kernels stood in for; returns every argument its main kernel got."""
    from vllm.model_executor.layers.mamba.ops import (
        selective_state_update_replayssm_output_only as replayssm,
    )

    launched: list[Any] = []

    class Launch:
        def __getitem__(self, grid: Any) -> Callable[..., None]:
            return lambda *args, **kw: launched.extend([*args, *kw.values()])

    monkeypatch.setattr(replayssm, "_replayssm_output_only_precompute_kernel", Launch())
    monkeypatch.setattr(replayssm, "_replayssm_output_only_kernel", Launch())
    # No Triton on this machine: vLLM's placeholder lacks its two helpers.
    helpers = SimpleNamespace(
        next_power_of_2=lambda n: 1 << max(n - 1, 0).bit_length(), cdiv=lambda a, b: -(-a // b)
    )
    monkeypatch.setattr(replayssm, "triton", helpers)
    # (BLOCK_SIZE_M, num_warps, tiles, num_stages), as its table would pick them.
    monkeypatch.setattr(replayssm, "get_replayssm_config", lambda *a, **kw: (16, 4, 16, 16, 1))
    # The call the fork's test makes on the GPU, so its arguments are checked here.
    args, kwargs = triton_replayssm_arguments("cpu")
    replayssm.selective_state_update_replayssm_output_only(*args, **kwargs, **extra)
    return launched


@since("0.27.0", "the Triton ReplaySSM kernel")
def test_the_triton_replayssm_draws_only_when_no_seed_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given = torch.tensor([5], dtype=torch.int64)
    torch.manual_seed(11)
    launched = run_triton_replayssm(monkeypatch, enable_stochastic_rounding=True, rand_seed=given)
    assert any(arg is given for arg in launched)
    # Stock: drawn here, from where the given seed left the generator.
    launched = run_triton_replayssm(monkeypatch, enable_stochastic_rounding=True)
    seeds = [a for a in launched if isinstance(a, torch.Tensor) and a.dtype == torch.int64]
    assert [int(seed.item()) for seed in seeds] == [stock_seed_after(11)]


@since("0.27.0", "the Triton ReplaySSM kernel")
def test_mamba_mixer2_hands_the_triton_replayssm_the_prefetched_seed() -> None:
    """Its one call of the kernel's wrapper passes rand_seed=prefetched_sr_seed(),
    the function the SSU backends ask (imported, so the module loads)."""
    import ast
    import inspect

    from vllm.model_executor.layers.mamba import mamba_mixer2

    assert mamba_mixer2.prefetched_sr_seed is ssu_dispatch.prefetched_sr_seed
    tree = ast.parse(inspect.getsource(mamba_mixer2.MambaMixer2.conv_ssm_forward).lstrip())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "selective_state_update_replayssm_output_only"
    ]
    assert len(calls) == 1
    seed = [k.value for k in calls[0].keywords if k.arg == "rand_seed"]
    assert [ast.unparse(v) for v in seed] == ["prefetched_sr_seed()"]


@only_in("reset")
def test_sr_seed_forward_opens_a_forward_only_for_an_unbatched_decode(
    engaged: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the runners wrap a forward in: the attached prefetcher's forward where
    one Mamba-2 layer's metadata has decode tokens, else the no-op context."""
    layer = "model.layers.0.mixer2"
    decode, prefill = SimpleNamespace(num_decodes=2), SimpleNamespace(num_decodes=0)
    noop = ssu_dispatch.sr_seed_forward({layer: decode})  # nothing attached yet
    ssu_dispatch.initialize_mamba_ssu_backend(mamba_config(), kv_cache_config(mamba2=3))
    opened: list[bool] = []

    class Prefetcher:
        @contextlib.contextmanager
        def forward(self, full_cudagraph: bool = False, captures: object = None) -> Iterator[None]:
            opened.append(full_cudagraph)
            yield

    monkeypatch.setattr(ssu_dispatch, "_sr_seed_prefetcher", Prefetcher())
    for metadata, kwargs in (
        ({layer: prefill}, {}),
        ({"model.layers.1.attn": decode}, {}),
        (None, {}),
        ([{layer: decode}], {}),  # V1's micro-batches: one metadata dict each
        ({layer: decode}, {"micro_batched": True}),
    ):
        assert ssu_dispatch.sr_seed_forward(metadata, **kwargs) is noop, metadata
    assert opened == []
    with ssu_dispatch.sr_seed_forward({layer: decode}):
        pass
    with ssu_dispatch.sr_seed_forward({layer: decode}, full_cudagraph=True):
        pass
    assert opened == [False, True]


@only_in("reset")
def test_without_triton_it_stays_off_with_one_line(
    kernel: KernelStandIn,
    cuda_platform: None,
    logged: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A vLLM whose Triton is missing (vllm.triton_utils' placeholders): stock, said why."""
    import vllm.triton_utils

    monkeypatch.setenv("VLLM_MAMBA_SR_SEED_PREFETCH", "1")
    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", False)
    ssu_dispatch.initialize_mamba_ssu_backend(mamba_config(), kv_cache_config(mamba2=2))
    assert ssu_dispatch._sr_seed_prefetcher is None
    assert [line for line in logged if "SEED" in line] == [
        "VLLM_MAMBA_SR_SEED_PREFETCH is set but unused: Triton, which draws the seeds, "
        "is not installed."
    ]


@only_in("forward-context")
def test_forwards_are_told_apart_by_the_forward_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.forward_context import ForwardContext, override_forward_context
    from vllm.v1.worker import ubatching

    assert ssu_dispatch._current_forward_context() is None
    context = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
    with override_forward_context(context):
        assert ssu_dispatch._current_forward_context() is context
        assert ssu_dispatch._in_micro_batch(context) is False
        monkeypatch.setitem(ubatching._THREAD_ID_TO_CONTEXT, 1, 0)
        assert ssu_dispatch._in_micro_batch(context) is True


class _Reports:
    """Collects the reports of a pytest run started in this process."""

    def __init__(self) -> None:
        self.reports: list[pytest.CollectReport | pytest.TestReport] = []

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.reports.append(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.append(report)


def test_the_forks_tests_collect_and_skip_without_a_device() -> None:
    # Run in this process, which has imported the patched tree's vllm already: a
    # subprocess would import it all again, for most of this directory's run time.
    collected = _Reports()
    tests = [str(TREE / path) for path in fork_test.PATHS if (TREE / path).is_file()]
    exit_code = pytest.main(
        [
            *tests,
            f"--rootdir={TREE}",
            "--import-mode=append",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:benchmark",
        ],
        plugins=[collected],
    )
    failures = [str(report.longrepr) for report in collected.reports if report.failed]
    assert exit_code == pytest.ExitCode.OK, "\n".join(failures)
    passed = [r.nodeid for r in collected.reports if r.passed and r.when == "call"]
    reasons = [str(report.longrepr) for report in collected.reports if report.skipped]
    reset = DESIGN == "reset"
    if reset:
        # The prefetcher's CPU tests pass; the engine's, on both runners, skip.
        assert len(passed) == 5 and all("test_sr_seed_prefetcher.py" in n for n in passed)
        assert len(tests) == 3
    else:
        assert passed == [] and len(tests) == 1
    # 6 tests per SSU call (FlashInfer's SSU, and its ReplaySSM where the release has
    # it: eager twice, graphs as V1 and V2 capture them, outside a forward, a draft
    # model's layers), the
    # Triton kernel's state on Blackwell, and the engine's two.
    calls = 2 if fork_test.FLASHINFER_REPLAYSSM in inspect.getsource(ssu_dispatch) else 1
    assert len(reasons) == 6 * calls + 1 + (2 if reset else 0), reasons
    blackwell = [reason for reason in reasons if "only Blackwell" in reason]
    assert len(blackwell) == 1, reasons
    assert all(
        "seed prefetching needs a CUDA device" in reason
        for reason in reasons
        if reason not in blackwell
    ), reasons
