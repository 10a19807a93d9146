# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""N stock-identical seeds from one kernel launch (csrc/stock_seeds.cu),
compiled on first use with `torch.utils.cpp_extension`."""

import functools
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.utils import cpp_extension

SOURCE = Path(__file__).with_name("csrc") / "stock_seeds.cu"
OP_NAMESPACE = "runner_hooks"
"""The op's torch.ops namespace, given to the source as SR_SEED_OP_NAMESPACE."""


class SeedKernelUnavailable(RuntimeError):
    """The seed op cannot be built or loaded here; the message says why."""


def build_library(capabilities: Sequence[tuple[int, int]]) -> Path:
    """Builds the op for `capabilities` unless cached (with nvcc, a C++ compiler
    and ninja; no device needed), loads it, returns its path."""
    if torch.version.cuda is None:
        raise SeedKernelUnavailable(
            f"torch {torch.__version__} was built without CUDA; "
            "install a CUDA build of torch"
        )
    if not SOURCE.is_file():
        raise SeedKernelUnavailable(
            f"{SOURCE} is missing: this installation lacks the op's CUDA source"
        )
    archs = sorted(f"{major}{minor}" for major, minor in set(capabilities))
    key = hashlib.sha256(
        SOURCE.read_bytes() + f"|{torch.__version__}|{archs}|{OP_NAMESPACE}".encode()
    ).hexdigest()
    try:
        library = cpp_extension.load(
            name=f"{OP_NAMESPACE}_stock_seeds_{key[:16]}",
            sources=[str(SOURCE)],
            # Explicit -gencode flags: torch then ignores TORCH_CUDA_ARCH_LIST.
            extra_cuda_cflags=[
                "-O3",
                f"-DSR_SEED_OP_NAMESPACE={OP_NAMESPACE}",
                *(f"-gencode=arch=compute_{arch},code=sm_{arch}" for arch in archs),
                *_curand_include_flags(),
            ],
            # The process's libstdc++: a compiler that links its own statically gives
            # the op a second copy, whose iostreams fail to format TORCH_CHECK messages.
            extra_ldflags=["-l:libstdc++.so.6"],
            is_python_module=False,
        )
    except (RuntimeError, OSError) as error:
        lines = str(error).splitlines()
        # lines[0] is torch's prefix glued to ninja's first command.
        errors = [line for line in lines[1:] if "error" in line.lower()]
        raise SeedKernelUnavailable(
            f"building {SOURCE.name} (CUDA_HOME={cpp_extension.CUDA_HOME}) failed; "
            "it needs nvcc, a C++ compiler and ninja:\n"
            + "\n".join((errors or lines)[:10])
        ) from error
    return Path(library)


@functools.cache
def stock_seeds_op() -> Callable[[torch.Tensor], None]:
    """The op, built and loaded once per process."""
    if not torch.cuda.is_available():
        raise SeedKernelUnavailable(
            f"no CUDA device is available (torch {torch.__version__}, "
            f"CUDA {torch.version.cuda})"
        )
    build_library(
        [
            torch.cuda.get_device_capability(index)
            for index in range(torch.accelerator.device_count())
        ]
    )
    return getattr(torch.ops, OP_NAMESPACE).stock_seeds.default


class KernelDrawer:
    """All of a forward's seeds from one launch; values and advance are stock's."""

    name = "kernel"

    def __init__(self) -> None:
        self._op = stock_seeds_op()

    def draw(self, out: torch.Tensor) -> None:
        self._op(out)


def _curand_include_flags() -> list[str]:
    """`-isystem` for the nvidia-curand wheel's headers if the toolkit lacks them."""
    cuda_home = cpp_extension.CUDA_HOME
    if cuda_home is None or Path(cuda_home, "include", "curand_kernel.h").exists():
        return []
    try:
        import nvidia  # type: ignore[import-not-found]
    except ImportError:
        return []
    for root in nvidia.__path__:
        for header in Path(root).glob("*/include/curand_kernel.h"):
            return ["-isystem", str(header.parent)]
    return []
