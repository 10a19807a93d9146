"""bench/engine/arms.py: the arms, their environments and engine arguments."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from . import arms, client
from .arms import ARMS, BY_NAME, CONTROLS, IDENTITY_ARMS, STOCK, TIMING_ARMS, GraphMode, Runner


def test_arms() -> None:
    assert ARMS[0] is STOCK
    # + the floors and the plugin
    assert len(BY_NAME) == len(IDENTITY_ARMS) + 3
    assert all(control.control and control.copy is None for control in CONTROLS)
    eager = arms.engine_kwargs("/m", GraphMode.EAGER)
    graphs = arms.engine_kwargs("/m", GraphMode.PIECEWISE, seed=3)
    assert eager["enforce_eager"] and "cudagraph_capture_sizes" not in eager
    assert graphs["compilation_config"]["cudagraph_mode"] == "PIECEWISE"
    assert graphs["compilation_config"]["inductor_compile_config"] == {
        "combo_kernels": True,
        "benchmark_combo_kernel": False,
        "deterministic": True,
        "triton.autotune_pointwise": False,
    }
    autotuned = arms.compilation_config(GraphMode.PIECEWISE, inductor_deterministic=False)
    tuned = autotuned["inductor_compile_config"]
    assert tuned.keys() == {"combo_kernels", "benchmark_combo_kernel"}
    assert graphs["seed"] == 3 and graphs["cudagraph_capture_sizes"] == [1, 2, 4, 8]
    assert Runner.V2.env == {"VLLM_USE_V2_MODEL_RUNNER": "1"}


def test_worker_environment_lets_the_arm_win() -> None:
    """Every arm gets the shared settings, except where its own env says otherwise."""
    common = dict(sites={"stock": "/s"}, gpu="1", cache_root=Path("/c"))
    shared = arms.DETERMINISTIC_ENV
    stock = client.environment(STOCK, Runner.V2, extra_env=shared, **common)
    own = arms.Arm("own", None, {"PYTHONHASHSEED": "1"})
    hashed = client.environment(own, Runner.V1, extra_env=shared, **common)
    assert stock["PYTHONHASHSEED"] == "0" and hashed["PYTHONHASHSEED"] == "1"
    assert stock["VLLM_USE_V2_MODEL_RUNNER"] == "1" and stock["CUDA_VISIBLE_DEVICES"] == "1"
    assert stock["TORCHINDUCTOR_DETERMINISTIC"] == hashed["TORCHINDUCTOR_DETERMINISTIC"] == "1"
    assert stock["VLLM_CACHE_ROOT"] == str(Path("/c/stock-v2-gpu1"))
    assert stock["PYTHONPATH"].endswith(os.pathsep + "/s")


def test_each_vllm_copy_has_its_own_flashinfer_workspace(monkeypatch) -> None:
    """Engines of one copy share FlashInfer's JIT builds; another copy's never reach them
    (FlashInfer would rebuild them for its own sources' path)."""
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", "/shared")  # the caller's, one for all
    common = dict(sites={"stock": "/s", "reset": "/r"}, gpu="0", cache_root=Path("/c"))
    stock = client.environment(STOCK, Runner.V1, **common)["FLASHINFER_WORKSPACE_BASE"]
    floor = client.environment(BY_NAME["floor"], Runner.V2, **common)["FLASHINFER_WORKSPACE_BASE"]
    reset = client.environment(BY_NAME["reset"], Runner.V1, **common)["FLASHINFER_WORKSPACE_BASE"]
    assert stock == floor == str(Path("/c/flashinfer-stock"))
    assert reset == str(Path("/c/flashinfer-reset"))


def test_every_arms_variant_exists() -> None:
    from bench.drawers import drawer_factory

    drawers = [a.drawer for a in BY_NAME.values() if a.drawer is not None]
    assert drawers == ["randint"]
    for drawer in drawers:
        drawer_factory(drawer)
    # Each timed arm's seed path is a variant of the microbenchmark (its predictions).
    from bench.variants import variant_specs

    names = {spec.name for spec in variant_specs()}
    assert {arm.microbench for arm in TIMING_ARMS} <= names
    assert [BY_NAME[a].microbench for a in ("reset", "reset-randint", "flag-off")] == [
        "reset-triton",
        "reset-randint",
        "stock",
    ]
    assert BY_NAME["floor"] in TIMING_ARMS and BY_NAME["floor"] not in IDENTITY_ARMS


def test_the_reset_designs_arms_draw_before_their_replays() -> None:
    """The arms whose replay spans start before the seeds drawn for them: the
    reset design's copy with the flag on (variants too) and the plugin; the retired
    arms' records name no arm a run takes."""
    drawing = {arm.name for arm in BY_NAME.values() if arm.draws_before_replays}
    assert drawing == {"reset", "reset-randint", "plugin"}
    assert not set(arms.RETIRED_ARMS) & set(BY_NAME)


def test_engine_kwargs_at_tp() -> None:
    single = arms.engine_kwargs("/m", GraphMode.EAGER)
    assert single["tensor_parallel_size"] == 1 and "distributed_executor_backend" not in single
    two = arms.engine_kwargs("/m", GraphMode.FULL_AND_PIECEWISE, tp=2)
    assert two["tensor_parallel_size"] == 2 and two["distributed_executor_backend"] == "mp"
    assert single["worker_cls"] == two["worker_cls"] == arms.WORKER_CLS
    module, name = arms.WORKER_CLS.rsplit(".", 1)
    source = Path(__file__).resolve().parents[2] / (module.replace(".", "/") + ".py")
    assert f"class {name}(Worker):" in source.read_text()


def test_every_engine_has_multicast_off_and_its_ranks_gpus(monkeypatch) -> None:
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # the caller's, which must not reach a rank
    common = dict(sites={"reset": "/r"}, cache_root=Path("/c"))
    arm = BY_NAME["reset"]
    two = client.environment(arm, Runner.V1, gpu="0,1", extra_env=arms.IDENTITY_ENV, **common)
    one = client.environment(arm, Runner.V1, gpu="1", **common)
    for env in (one, two):
        assert {k: env[k] for k in arms.MULTICAST_OFF_ENV} == {
            "NCCL_NVLS_ENABLE": "0",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1",
        }
        assert env.items() >= arm.env.items() and env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert two["CUDA_VISIBLE_DEVICES"] == "0,1" and two["SR_ENGINE_TORCH_DETERMINISTIC"] == "1"
    assert two["VLLM_CACHE_ROOT"] == str(Path("/c/reset-v1-gpu0-1"))
    assert one["VLLM_CACHE_ROOT"] == str(Path("/c/reset-v1-gpu1"))  # as before TP


def test_plain_serving_adds_nothing_and_the_others_their_options() -> None:
    compiled = GraphMode.FULL_AND_PIECEWISE
    plain = arms.engine_kwargs("/m", compiled)
    assert plain == arms.engine_kwargs("/m", compiled, serving=arms.PLAIN)
    assert not {"speculative_config", "async_scheduling", "enable_prefix_caching"} & set(plain)
    by = arms.SERVING_BY_NAME
    mtp7 = arms.engine_kwargs("/m", compiled, serving=by["mtp7"])
    assert mtp7["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 7}
    # Graphs per token count of a verify step: BS x (1 + K).
    assert mtp7["cudagraph_capture_sizes"] == [8, 16, 32, 64]
    assert arms.engine_kwargs("/m", compiled, serving=by["mtp3"])["cudagraph_capture_sizes"] == [
        4,
        8,
        16,
        32,
    ]
    assert "cudagraph_capture_sizes" not in arms.engine_kwargs(
        "/m", GraphMode.EAGER, serving=by["mtp3"]
    )
    assert arms.engine_kwargs("/m", compiled, serving=by["sync"])["async_scheduling"] is False
    prefix = arms.engine_kwargs("/m", compiled, serving=by["prefix"])
    assert prefix["enable_prefix_caching"] and prefix["mamba_cache_mode"] == "align"
    assert prefix["enable_chunked_prefill"]
    seed = arms.engine_kwargs("/m", compiled, serving=by["seed-serving"])
    assert seed["speculative_config"]["num_speculative_tokens"] == 7
    assert seed["mamba_cache_mode"] == "align" and "async_scheduling" not in seed
    # Every serving but plain logs stats (the record's counters).
    for serving in arms.SERVINGS[1:]:
        assert arms.engine_kwargs("/m", compiled, serving=serving)["disable_log_stats"] is False


@pytest.mark.parametrize(
    ("serving", "mode", "sizes"),
    [
        ("plain", GraphMode.FULL_AND_PIECEWISE, [1, 2, 4, 8, 128]),
        ("mtp7", GraphMode.FULL_AND_PIECEWISE, [8, 16, 32, 64, 128]),
        ("plain", GraphMode.EAGER, None),
    ],
)
def test_a_step_budget_is_also_a_captured_size(serving: str, mode: GraphMode, sizes) -> None:
    """A mixed step that fills the budget runs piecewise graphs of that size."""
    serving_ = arms.SERVING_BY_NAME[serving]
    kwargs = arms.engine_kwargs("/m", mode, serving=serving_, step_tokens=128)
    assert kwargs["max_num_batched_tokens"] == 128
    assert kwargs.get("cudagraph_capture_sizes") == sizes
    plain = arms.engine_kwargs("/m", mode, serving=serving_)
    assert {k: v for k, v in kwargs.items() if k not in plain or plain[k] != v} == {
        "max_num_batched_tokens": 128,
        **({"cudagraph_capture_sizes": sizes} if sizes else {}),
    }
