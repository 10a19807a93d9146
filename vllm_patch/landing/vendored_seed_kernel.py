# Lands in vLLM as seed_kernel.py of the vendored package (the reset design; LANDED in
# vendor.py), in place of runner_hooks.core.seed_kernel, which compiles the op on first
# use: in vLLM the op is the _mamba_sr_C extension, built by vLLM's CMake from
# csrc/mamba/stock_seeds.cu (targets/cmake_lists.py) or placed beside an installed vLLM
# by `sr-prefetch build-op`, and called through _custom_ops.mamba_sr_stock_seeds.

# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""N stock-identical seeds from one kernel launch: the stock_seeds op of vLLM's
_mamba_sr_C extension (csrc/mamba/stock_seeds.cu)."""

import functools
from collections.abc import Callable

import torch


class SeedKernelUnavailable(RuntimeError):
    """The seed op cannot be loaded here; the message says why."""


@functools.cache
def stock_seeds_op() -> Callable[[torch.Tensor], None]:
    """The op, loaded once per process."""
    if not torch.cuda.is_available():
        raise SeedKernelUnavailable(
            f"no CUDA device is available (torch {torch.__version__}, "
            f"CUDA {torch.version.cuda})"
        )
    try:
        import vllm._mamba_sr_C  # noqa: F401  (registers torch.ops._mamba_sr_C)
    except ImportError as error:
        raise SeedKernelUnavailable(
            f"vllm._mamba_sr_C is not built ({error}); vLLM's CUDA build makes it "
            "from csrc/mamba/stock_seeds.cu"
        ) from None
    from vllm import _custom_ops

    return _custom_ops.mamba_sr_stock_seeds


class KernelDrawer:
    """All of a forward's seeds from one launch; values and advance are stock's."""

    name = "kernel"

    def __init__(self) -> None:
        self._op = stock_seeds_op()

    def draw(self, out: torch.Tensor) -> None:
        self._op(out)
