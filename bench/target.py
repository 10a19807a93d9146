"""What the bench runs on: FlashInfer's SSU on the current CUDA device, or why it cannot.

FlashInfer is imported here, when the first test asks, never at collection:
`pytest bench` must collect, and skip with this module's reason, on a machine
without CUDA or FlashInfer.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from .model import SsuKernel


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


def flashinfer_target() -> Target:
    """FlashInfer's `selective_state_update` on the current CUDA device.

    Raises BenchUnavailable without CUDA, or where FlashInfer's Mamba module
    does not import (not installed, or a dependency missing).
    """
    if not torch.cuda.is_available():
        raise BenchUnavailable("CUDA is not available: the bench times the FlashInfer SSU on a GPU")
    try:
        flashinfer = importlib.import_module("flashinfer")
        mamba = importlib.import_module("flashinfer.mamba")
    except Exception as exc:  # whatever the import raised, the answer is "no FlashInfer here"
        raise BenchUnavailable(
            f"FlashInfer's Mamba SSU does not import ({type(exc).__name__}: {exc}); "
            "install the bench extra: pip install -e '.[bench]'"
        ) from exc
    device = torch.device("cuda", torch.cuda.current_device())
    major, minor = torch.cuda.get_device_capability(device)
    return Target(
        ssu=mamba.selective_state_update,
        device=device,
        gpu=torch.cuda.get_device_name(device),
        platform=(
            f"torch {torch.__version__} (CUDA {torch.version.cuda}), "
            f"FlashInfer {getattr(flashinfer, '__version__', 'unknown')}, sm_{major}{minor}"
        ),
    )
