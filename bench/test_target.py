"""Where the bench runs: each --bench-ssu target's reasons for not running, and
the Triton SSU called as vLLM's TritonSSUBackend calls it."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

from .options import BenchOptions
from .synthetic_model import NULL_SLOT
from .target import TARGETS, BenchUnavailable, TritonSsu, triton_target


def pretend_gpu(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], name: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


@pytest.mark.parametrize("ssu", sorted(TARGETS))
def test_without_cuda_every_target_says_so(ssu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BenchUnavailable, match="CUDA is not available"):
        TARGETS[ssu]()


def test_the_triton_ssu_skips_below_blackwell_naming_cvt_rs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pretend_gpu(monkeypatch, (9, 0), "NVIDIA H200")
    with pytest.raises(BenchUnavailable, match=r"cvt\.rs.*NVIDIA H200 is sm_90"):
        triton_target()


def test_the_triton_ssu_needs_the_patched_rand_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vLLM this project installs is unpatched: its kernel takes no seed."""
    pytest.importorskip("vllm.model_executor.layers.mamba.ops.mamba_ssm")
    pretend_gpu(monkeypatch, (10, 0), "NVIDIA B200")
    with pytest.raises(BenchUnavailable, match=r"takes no rand_seed.*sr-prefetch apply"):
        triton_target()


TRITON_PARAMETERS = (
    "state x dt A B C D dt_bias z dt_softplus state_batch_indices dst_state_batch_indices "
    "{null_slot} out is_blackwell enable_stochastic_rounding cache_philox_rounds rand_seed"
)
"""Triton's selective_state_update's parameters, patched (rand_seed last)."""


def recorder(null_slot: str) -> tuple[list[dict[str, Any]], Any]:
    """A stand-in of Triton's selective_state_update whose null-slot parameter
    is named `null_slot`; records each call's arguments by name."""
    signature = inspect.Signature(
        [
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for name in TRITON_PARAMETERS.format(null_slot=null_slot).split()
        ]
    )
    calls: list[dict[str, Any]] = []

    def selective_state_update(*args: Any, **kwargs: Any) -> None:
        calls.append(signature.bind(*args, **kwargs).arguments)

    selective_state_update.__signature__ = signature  # type: ignore[attr-defined]
    return calls, selective_state_update


@pytest.mark.parametrize("null_slot", ["null_block_id", "pad_slot_id"])
def test_triton_ssu_is_called_as_vllms_backend_calls_it(null_slot: str) -> None:
    calls, kernel = recorder(null_slot)
    tensors = {name: torch.zeros(1) for name in ("state", "x", "dt", "A", "B", "C", "D")}
    extra = {
        "dt_bias": torch.zeros(1),
        "state_batch_indices": torch.zeros(1),
        "dst_state_batch_indices": torch.zeros(1),
        "out": torch.zeros(1),
        "rand_seed": torch.zeros(1, dtype=torch.int64),
    }
    TritonSsu(kernel)(
        *tensors.values(),
        z=None,
        dt_softplus=True,
        pad_slot_id=NULL_SLOT,
        philox_rounds=5,
        **extra,
    )
    (call,) = calls
    for name, tensor in {**tensors, **extra}.items():
        assert call[name] is tensor, name
    assert call[null_slot] == NULL_SLOT
    assert call["is_blackwell"] and call["enable_stochastic_rounding"]
    assert call["cache_philox_rounds"] == 5 and call["dt_softplus"] and call["z"] is None


def test_summary_files_name_the_triton_ssu() -> None:
    assert BenchOptions().tag == ""
    assert BenchOptions(ssu="triton").tag == "triton"
    assert BenchOptions(ssu="triton", gemms=True).tag == "triton-gemms"
    assert BenchOptions(gemms=True).tag == "gemms"
