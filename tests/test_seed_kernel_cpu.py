"""The seed kernel's failure modes, and its input checks, without a GPU.

Each missing piece (device, CUDA build of torch, the toolchain, the source) and
a compiler error must surface as `SeedKernelUnavailable` with a message that says
what to fix, so a runner can fall back to stock draws and tell the user why.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

from runner_hooks.core import seed_kernel
from runner_hooks.core.seed_kernel import KernelDrawer, SeedKernelUnavailable

from .child import run_child

H200 = [(9, 0)]

NAME = "runner_hooks_stock_seeds_0123456789abcdef"
NVCC = f"/usr/local/cuda/bin/nvcc -DTORCH_EXTENSION_NAME={NAME} -O3 -c stock_seeds.cu"
NVCC_FAILURE = "\n".join(
    [  # torch's message: its prefix, then ninja's output
        f"Error building extension '{NAME}': [1/2] {NVCC}",
        "FAILED: stock_seeds.cuda.o",
        NVCC,
        'stock_seeds.cu(87): error: class "at::CUDAGeneratorImpl" has no member "philox_state"',
        "      philox = gen->philox_state(4 * n);",
        "                    ^",
        '1 error detected in the compilation of "stock_seeds.cu".',
        "ninja: build stopped: subcommand failed.",
    ]
)


def test_no_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # Uncached: on a GPU machine an earlier test may have loaded the op already.
    monkeypatch.setattr(seed_kernel, "stock_seeds_op", seed_kernel.stock_seeds_op.__wrapped__)
    with pytest.raises(SeedKernelUnavailable, match="no CUDA device is available"):
        KernelDrawer()


def test_cpu_only_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(SeedKernelUnavailable, match="built without CUDA"):
        seed_kernel.build_library(H200)


@pytest.fixture
def toolchain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A CUDA build of torch with CUDA_HOME at a scratch directory."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))
    return tmp_path


def test_missing_toolchain_says_what_it_needs(
    toolchain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's own errors for a missing CUDA_HOME, nvcc or ninja surface with the fix."""

    def fail(**kwargs: object) -> None:
        raise OSError(
            "CUDA_HOME environment variable is not set. Please set it to your CUDA install root."
        )

    monkeypatch.setattr(cpp_extension, "load", fail)
    with pytest.raises(SeedKernelUnavailable) as raised:
        seed_kernel.build_library(H200)
    message = str(raised.value)
    assert "it needs nvcc, a C++ compiler and ninja" in message
    assert "CUDA_HOME environment variable is not set" in message


def test_missing_cuda_source(toolchain: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wheel built without its package data falls back instead of failing at startup."""
    monkeypatch.setattr(seed_kernel, "SOURCE", toolchain / "csrc" / "stock_seeds.cu")
    with pytest.raises(SeedKernelUnavailable, match="lacks the op's CUDA source"):
        seed_kernel.build_library(H200)


def test_build_error_shows_the_compiler_errors(
    toolchain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(**kwargs: object) -> None:
        raise RuntimeError(NVCC_FAILURE)

    monkeypatch.setattr(cpp_extension, "load", fail)
    with pytest.raises(SeedKernelUnavailable) as raised:
        seed_kernel.build_library(H200)
    message = str(raised.value)
    assert message.startswith(f"building stock_seeds.cu (CUDA_HOME={toolchain}) failed; ")
    assert 'stock_seeds.cu(87): error: class "at::CUDAGeneratorImpl" has no member' in message
    assert "1 error detected" in message
    assert "[1/2]" not in message
    assert "FAILED" not in message, "build commands should be left out"


@pytest.fixture(scope="module")
def op_without_device() -> Callable[[torch.Tensor], None]:
    """The op, built for sm_90 where torch is a CUDA build but no device is visible."""
    if torch.cuda.is_available():
        pytest.skip("checked against real CUDA tensors in tests/gpu/test_seed_kernel.py")
    try:
        seed_kernel.build_library(H200)
    except SeedKernelUnavailable as error:
        pytest.skip(f"seed kernel cannot be built here: {error}")
    return torch.ops.runner_hooks.stock_seeds.default


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (torch.empty(4, dtype=torch.float32), r"must be int64, .* got Float"),
        (torch.empty(2, 2, dtype=torch.int64), r"must be 1-D, .* got shape \[2, 2\]"),
        (torch.empty(8, dtype=torch.int64)[::2], "must be contiguous"),
        (torch.empty(4, dtype=torch.int64), "must be a CUDA tensor; got a tensor on cpu"),
    ],
)
def test_input_checks(
    op_without_device: Callable[[torch.Tensor], None], out: torch.Tensor, message: str
) -> None:
    with pytest.raises(RuntimeError, match=message):
        op_without_device(out)


COMPILER = shutil.which(os.environ.get("CXX", "c++"))
STATIC_CHILD = """
import sys
import torch
from torch.utils import cpp_extension
from runner_hooks.core import seed_kernel
if sys.argv[1] == "control":  # linked as before the fix: the compiler's libstdc++ alone
    load = cpp_extension.load
    cpp_extension.load = lambda **kwargs: load(**{**kwargs, "extra_ldflags": []})
seed_kernel.OP_NAMESPACE = "static_libstdcxx"
seed_kernel.build_library([(9, 0)])
try:
    torch.ops.static_libstdcxx.stock_seeds.default(torch.empty(2, 2, dtype=torch.int64))
except RuntimeError as error:
    print(str(error).splitlines()[0])
"""


@pytest.mark.skipif(
    cpp_extension.CUDA_HOME is None or COMPILER is None,
    reason="needs nvcc (CUDA_HOME) and a C++ compiler to build the op",
)
@pytest.mark.skipif(torch.version.cuda is None, reason="needs a CUDA build of torch")
@pytest.mark.parametrize("build", ["fixed", "control"])
def test_check_messages_survive_a_compiler_that_links_libstdcxx_statically(
    build: str, tmp_path: Path
) -> None:
    """Such a CXX gave the op a second libstdc++: on the H200 machine (its CXX is one)
    formatting a check's number crashed the process; the control's message is not whole."""
    cxx = tmp_path / "c++"
    cxx.write_text(f'#!/bin/sh\nexec {COMPILER} "$@" -static-libstdc++\n')
    cxx.chmod(0o755)
    child = run_child(
        STATIC_CHILD,
        build,
        timeout=600,
        env={"CXX": str(cxx), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")},
    )
    raised = child.returncode == 0 and "got shape [2, 2]" in child.stdout
    if build == "fixed":
        assert raised, f"exit status {child.returncode}: {child.stdout} {child.stderr[-2000:]}"
    else:
        assert not raised, "the control, linked without the process's libstdc++, raised intact"
