# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""N stock-identical seeds from one kernel launch (csrc/stock_seeds.cu),
compiled on first use with `torch.utils.cpp_extension`.

The source registers its op as vLLM's own extensions do (csrc/core/registration.h
is vLLM's header): in the torch.ops namespace named by the build, its
TORCH_EXTENSION_NAME.  Here that is this build's own name (`build_name`)."""

import functools
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.utils import cpp_extension

SOURCE = Path(__file__).with_name("csrc") / "stock_seeds.cu"
INCLUDE_DIR = SOURCE.parent
"""Where the source's `#include "core/registration.h"` is found."""
BUILD_PREFIX = "runner_hooks_stock_seeds"


class SeedKernelUnavailable(RuntimeError):
    """The seed op cannot be built or loaded here; the message says why."""


def _archs(capabilities: Sequence[tuple[int, int]]) -> list[str]:
    return sorted(f"{major}{minor}" for major, minor in set(capabilities))


def build_name(capabilities: Sequence[tuple[int, int]]) -> str:
    """The build's name, which is also its op's namespace: named by the source's path
    and bytes, torch's version and the architectures, so that installations sharing
    TORCH_EXTENSIONS_DIR each keep their own build, not rebuilding each other's."""
    key = hashlib.sha256(
        SOURCE.read_bytes()
        + f"|{SOURCE.resolve()}|{torch.__version__}|{_archs(capabilities)}".encode()
    ).hexdigest()
    return f"{BUILD_PREFIX}_{key[:16]}"


def build_library(
    capabilities: Sequence[tuple[int, int]],
    *,
    name: str | None = None,
    build_directory: Path | None = None,
) -> Path:
    """Builds the op for `capabilities` unless cached (with nvcc, a C++ compiler
    and ninja; no device needed), loads it, returns its path.  `name` (default
    `build_name`) is the extension's name and its op's namespace; `build_directory`
    (default: torch's extension cache) is where it is built."""
    if torch.version.cuda is None:
        raise SeedKernelUnavailable(
            f"torch {torch.__version__} was built without CUDA; "
            "install a CUDA build of torch"
        )
    if not SOURCE.is_file():
        raise SeedKernelUnavailable(
            f"{SOURCE} is missing: this installation lacks the op's CUDA source"
        )
    archs = _archs(capabilities)
    try:
        library = cpp_extension.load(
            name=name or build_name(capabilities),
            sources=[str(SOURCE)],
            extra_include_paths=[str(INCLUDE_DIR)],
            # Explicit -gencode flags: torch then ignores TORCH_CUDA_ARCH_LIST.
            extra_cuda_cflags=[
                "-O3",
                *(f"-gencode=arch=compute_{arch},code=sm_{arch}" for arch in archs),
                *_curand_include_flags(),
            ],
            # The process's libstdc++: a compiler that links its own statically gives
            # the op a second copy, whose iostreams fail to format TORCH_CHECK messages.
            extra_ldflags=["-l:libstdc++.so.6"],
            build_directory=None if build_directory is None else str(build_directory),
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
    capabilities = [
        torch.cuda.get_device_capability(index)
        for index in range(torch.accelerator.device_count())
    ]
    name = build_name(capabilities)
    build_library(capabilities, name=name)
    return getattr(torch.ops, name).stock_seeds.default


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
