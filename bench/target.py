"""What the bench runs on: an SSU kernel on the current CUDA device, or why it cannot.

`--bench-ssu` picks the kernel (TARGETS): FlashInfer's, or vLLM's Triton SSU
(its default Mamba backend).  Either is imported here, when the first test
asks, never at collection: `pytest bench` must collect, and skip with this
module's reason, on a machine that cannot run it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .synthetic_model import SsuKernel


class BenchUnavailable(Exception):
    """The bench cannot run on this machine; the message says why."""


@dataclass(frozen=True)
class Target:
    """The SSU kernel, the device it runs on, and how the summary names them."""

    ssu: SsuKernel
    device: torch.device
    gpu: str
    """The device's name, e.g. 'NVIDIA H200'; it names the summary files."""
    platform: str
    """Versions and architecture, one line for the summary."""


def _current_device(ssu: str) -> tuple[torch.device, str, tuple[int, int]]:
    """The current CUDA device, its name and compute capability; raises
    BenchUnavailable without CUDA (`ssu` names the kernel the bench would time)."""
    if not torch.cuda.is_available():
        raise BenchUnavailable(f"CUDA is not available: the bench times the {ssu} on a GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    return device, torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)


def _platform(kernel: str, capability: tuple[int, int]) -> str:
    """The summary's one line of versions and architecture."""
    major, minor = capability
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}), {kernel}, sm_{major}{minor}"


def flashinfer_target() -> Target:
    """FlashInfer's `selective_state_update` on the current CUDA device.

    Raises BenchUnavailable without CUDA, or where FlashInfer's Mamba module
    does not import (not installed, or a dependency missing).
    """
    device, gpu, capability = _current_device("FlashInfer SSU")
    try:
        flashinfer = importlib.import_module("flashinfer")
        mamba = importlib.import_module("flashinfer.mamba")
    except Exception as exc:  # whatever the import raised, the answer is "no FlashInfer here"
        raise BenchUnavailable(
            f"FlashInfer's Mamba SSU does not import ({type(exc).__name__}: {exc}); "
            "install the bench extra: pip install -e '.[bench]'"
        ) from exc
    return Target(
        ssu=mamba.selective_state_update,
        device=device,
        gpu=gpu,
        platform=_platform(
            f"FlashInfer {getattr(flashinfer, '__version__', 'unknown')}", capability
        ),
    )


BLACKWELL_MAJOR = 10
"""Compute capability major of Blackwell (sm_100), the first with cvt.rs."""


def triton_target() -> Target:
    """vLLM's Triton `selective_state_update`, with the patch's rand_seed, on the
    current CUDA device.

    Raises BenchUnavailable without CUDA; below Blackwell, whose PTX has the
    cvt.rs.f16x2.f32 that the kernel's stochastic rounding needs (on an H200,
    stock vLLM's Triton SSU with stochastic rounding fails to compile: ptxas
    "Feature '.rs' not supported on .target 'sm_90a'"); where vLLM's Triton SSU
    does not import; and where its `selective_state_update` takes no rand_seed
    (an unpatched vLLM: no variant could hand it its seed).
    """
    device, gpu, capability = _current_device("Triton SSU")
    major, minor = capability
    if major < BLACKWELL_MAJOR:
        raise BenchUnavailable(
            f"the Triton SSU rounds stochastically with the PTX instruction cvt.rs.f16x2.f32, "
            f"which only Blackwell (compute capability 10.x) has; {gpu} is sm_{major}{minor}"
        )
    try:
        vllm = importlib.import_module("vllm")
        mamba_ssm = importlib.import_module("vllm.model_executor.layers.mamba.ops.mamba_ssm")
    except Exception as exc:  # whatever the import raised, the answer is "no Triton SSU here"
        raise BenchUnavailable(
            f"vLLM's Triton SSU does not import ({type(exc).__name__}: {exc}); install vllm"
        ) from exc
    kernel = mamba_ssm.selective_state_update
    if "rand_seed" not in inspect.signature(kernel).parameters:
        raise BenchUnavailable(
            f"vLLM {vllm.__version__}'s Triton selective_state_update takes no rand_seed, "
            "so no variant can hand it a seed: apply the patch to this vLLM first "
            "(sr-prefetch apply --installed)"
        )
    return Target(
        ssu=TritonSsu(kernel),
        device=device,
        gpu=gpu,
        platform=_platform(f"vLLM {vllm.__version__} Triton SSU", capability),
    )


class TritonSsu:
    """vLLM's Triton `selective_state_update` behind FlashInfer's signature
    (synthetic_model.SsuKernel), called as vLLM's TritonSSUBackend calls it, with the
    seed handed over in the patch's rand_seed."""

    def __init__(self, kernel: Callable[..., object]) -> None:
        self._kernel = kernel
        # The null slot's parameter: null_block_id, pad_slot_id in older releases.
        parameters = inspect.signature(kernel).parameters
        self._null_slot = "null_block_id" if "null_block_id" in parameters else "pad_slot_id"

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
    ) -> object:
        return self._kernel(
            state,
            x,
            dt,
            A,
            B,
            C,
            D=D,
            z=z,
            dt_bias=dt_bias,
            dt_softplus=dt_softplus,
            state_batch_indices=state_batch_indices,
            dst_state_batch_indices=dst_state_batch_indices,
            out=out,
            is_blackwell=True,
            enable_stochastic_rounding=True,
            cache_philox_rounds=philox_rounds,
            rand_seed=rand_seed,
            **{self._null_slot: pad_slot_id},
        )


TARGETS: dict[str, Callable[[], Target]] = {
    "flashinfer": flashinfer_target,
    "triton": triton_target,
}
"""--bench-ssu's choices: the SSU kernel each names, located on first use."""
