"""N stock-identical seeds from one kernel launch.

`KernelDrawer` runs the op `stock_seeds` (csrc/stock_seeds.cu) of the
namespace `OP_NAMESPACE` (`runner_hooks` here; vLLM's vendored copy has its own): one
launch that reserves a forward's 4*N Philox offsets from the device's default
CUDA generator at once and computes, bit for bit, the N values that N stock
`torch.randint(0, 2**32, (1,))` calls would return, eagerly and under CUDA-graph
capture.  The op is compiled on first use with `torch.utils.cpp_extension`,
for the visible devices' architectures, into torch's extension cache.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.utils import cpp_extension

SOURCE = Path(__file__).with_name("csrc") / "stock_seeds.cu"
"""The op's CUDA and registration source."""

OP_NAMESPACE = "runner_hooks"
"""The torch.ops namespace the op is registered under, handed to the source as the macro
SR_SEED_OP_NAMESPACE.  The copy vendored into vLLM sets its own (vllm_patch/vendor.py),
so the two never register the same op."""

_ERROR_LINE = re.compile(
    r"\berror\b|\bfatal\b|not found|cannot find|no such file|undefined", re.IGNORECASE
)
_TORCH_BUILD_PREFIX = "Error building extension"
_ERROR_LINES_SHOWN = 10

_lock = threading.Lock()
_op: Callable[[torch.Tensor], None] | None = None


class SeedKernelUnavailable(RuntimeError):
    """The seed op cannot be built or loaded here; the message says why."""


def build_library(capabilities: Sequence[tuple[int, int]]) -> Path:
    """Compiles the op for `capabilities` if torch's cache lacks it, and loads it.

    Needs nvcc and a C++ compiler but no device, so a build can be checked on a
    machine without one.  The extension's name hashes the source, the torch
    version and the architectures: an edited source or another torch gets its
    own build directory instead of reusing a stale library.  Only one build may
    be loaded per process: each registers the same `OP_NAMESPACE` op.
    Returns the loaded shared library's path.
    """
    if torch.version.cuda is None:
        raise SeedKernelUnavailable(
            f"torch {torch.__version__} was built without CUDA; "
            "install a CUDA build of torch"
        )
    cuda_home = cpp_extension.CUDA_HOME
    if cuda_home is None or not Path(cuda_home, "bin", "nvcc").exists():
        raise SeedKernelUnavailable(
            f"nvcc not found (CUDA_HOME={cuda_home}); install the CUDA toolkit "
            f"matching torch's CUDA {torch.version.cuda} and set CUDA_HOME to it"
        )
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise SeedKernelUnavailable(
            f"no C++ compiler: {compiler!r} is not on PATH; install g++ or set CXX"
        )
    if not cpp_extension.is_ninja_available():
        raise SeedKernelUnavailable("ninja not found; `pip install ninja`")

    if not SOURCE.is_file():
        raise SeedKernelUnavailable(
            f"{SOURCE} is missing: this installation of the package lacks its CUDA "
            "source (package data csrc/*.cu)"
        )
    source = SOURCE.read_bytes()
    archs = sorted(f"{major}{minor}" for major, minor in set(capabilities))
    key = hashlib.sha256(
        source + f"|{torch.__version__}|{archs}|{OP_NAMESPACE}".encode()
    ).hexdigest()
    try:
        library = cpp_extension.load(
            name=f"{OP_NAMESPACE}_stock_seeds_{key[:16]}",
            sources=[str(SOURCE)],
            # Explicit -gencode flags make torch ignore TORCH_CUDA_ARCH_LIST,
            # which images set for their own builds: one arch builds fastest.
            extra_cuda_cflags=[
                "-O3",
                f"-DSR_SEED_OP_NAMESPACE={OP_NAMESPACE}",
                *(f"-gencode=arch=compute_{arch},code=sm_{arch}" for arch in archs),
                *_curand_include_flags(cuda_home),
            ],
            is_python_module=False,
        )
    except (RuntimeError, OSError) as error:
        raise SeedKernelUnavailable(
            f"building {SOURCE.name} (CUDA_HOME={cuda_home}) failed:\n"
            + _error_lines(str(error))
        ) from error
    return Path(library)


def stock_seeds_op() -> Callable[[torch.Tensor], None]:
    """`torch.ops.<OP_NAMESPACE>.stock_seeds`, built and loaded once per process.

    Thread-safe: the first caller builds (torch's file lock guards the cache
    against other processes) while the others wait, then all get the same op.
    """
    global _op
    if not torch.cuda.is_available():
        build = (
            "CPU-only" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        )
        raise SeedKernelUnavailable(
            f"no CUDA device is available (torch {torch.__version__}, {build}); "
            "the seed kernel draws from a device's generator"
        )
    with _lock:
        if _op is None:
            capabilities = [
                torch.cuda.get_device_capability(index)
                for index in range(torch.cuda.device_count())
            ]
            build_library(capabilities)
            _op = getattr(torch.ops, OP_NAMESPACE).stock_seeds.default
        return _op


class KernelDrawer:
    """All of a forward's seeds from one launch, values and generator advance stock's.

    Construction builds or loads the op, so a missing toolkit or a build error
    shows up as `SeedKernelUnavailable` when the drawer is chosen, not mid-forward.
    """

    name = "kernel"

    def __init__(self) -> None:
        self._op = stock_seeds_op()

    def draw(self, out: torch.Tensor) -> None:
        """Fills the 1-D contiguous int64 CUDA tensor `out`, on the current stream.

        out[k] is the value the k-th of len(out) consecutive stock draws on
        out's device would return from its generator's present state.
        """
        self._op(out)


def _curand_include_flags(cuda_home: str) -> list[str]:
    """`-isystem` for pip's cuRAND headers when the toolkit has none.

    A toolkit assembled from pip packages (nvidia-cuda-nvcc and friends) lacks
    curand_kernel.h; torch's CUDA wheels depend on nvidia-curand, which ships
    it.  Searched after the toolkit's own include directory, so it only fills
    that gap.
    """
    if Path(cuda_home, "include", "curand_kernel.h").exists():
        return []
    try:
        import nvidia  # type: ignore[import-not-found]
    except ImportError:
        return []
    headers = (
        header
        for root in nvidia.__path__
        for header in Path(root).glob("*/include/curand_kernel.h")
    )
    header = next(headers, None)
    return [] if header is None else ["-isystem", str(header.parent)]


def _error_lines(message: str) -> str:
    """The lines that say what broke, out of torch's pages of build commands.

    torch's first line is its prefix glued to ninja's first command line, so it
    is left out; a message with no error lines (a failed dlopen) is shown as is.
    """
    lines = message.splitlines()
    errors = [
        line
        for line in lines
        if _ERROR_LINE.search(line) and not line.startswith(_TORCH_BUILD_PREFIX)
    ]
    return "\n".join((errors or lines)[:_ERROR_LINES_SHOWN])
