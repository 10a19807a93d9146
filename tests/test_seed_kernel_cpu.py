"""The seed kernel's failure modes, and its registration, without a GPU.

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


def test_the_build_passes_vllms_registration_header_and_a_name_of_its_own(
    toolchain: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The source includes vLLM's core/registration.h and takes its op's namespace from
    TORCH_EXTENSION_NAME: the build's name, by default one of runner_hooks' own."""
    calls: list[dict[str, object]] = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: calls.append(kwargs) or "x.so")
    assert seed_kernel.build_library(H200) == Path("x.so")
    seed_kernel.build_library(H200, name="_mamba_sr_C", build_directory=tmp_path)
    default, named = calls
    assert default["name"] == seed_kernel.build_name(H200)
    assert str(default["name"]).startswith(f"{seed_kernel.BUILD_PREFIX}_")
    assert default["build_directory"] is None
    assert (named["name"], named["build_directory"]) == ("_mamba_sr_C", str(tmp_path))
    (include,) = default["extra_include_paths"]  # type: ignore[misc]
    assert (Path(include) / "core" / "registration.h").is_file()
    assert '#include "core/registration.h"' in seed_kernel.SOURCE.read_text()
    flags = default["extra_cuda_cflags"]
    assert "-gencode=arch=compute_90,code=sm_90" in flags  # type: ignore[operator]
    assert not any("NAMESPACE" in flag for flag in flags)  # type: ignore[union-attr]


def test_the_build_name_follows_the_source_s_path_and_bytes_torch_and_archs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two installations of runner_hooks sharing TORCH_EXTENSIONS_DIR keep a build each."""
    name = seed_kernel.build_name(H200)
    assert seed_kernel.build_name([(9, 0), (9, 0)]) == name
    assert seed_kernel.build_name([(10, 0)]) != name
    copy = tmp_path / "csrc" / "stock_seeds.cu"
    copy.parent.mkdir()
    copy.write_bytes(seed_kernel.SOURCE.read_bytes())
    monkeypatch.setattr(seed_kernel, "SOURCE", copy)
    assert seed_kernel.build_name(H200) != name  # the same bytes elsewhere
    at_copy = seed_kernel.build_name(H200)
    copy.write_bytes(copy.read_bytes() + b"// changed\n")
    assert seed_kernel.build_name(H200) != at_copy
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    copy.write_bytes(seed_kernel.SOURCE.read_bytes().removesuffix(b"// changed\n"))
    assert seed_kernel.build_name(H200) != at_copy


@pytest.fixture(scope="module")
def op_without_device() -> Callable[[torch.Tensor], None]:
    """The op, built for sm_90 where torch is a CUDA build but no device is visible."""
    if torch.cuda.is_available():
        pytest.skip("checked against real CUDA tensors in tests/gpu/test_seed_kernel.py")
    name = seed_kernel.build_name(H200)
    try:
        seed_kernel.build_library(H200, name=name)
    except SeedKernelUnavailable as error:
        pytest.skip(f"seed kernel cannot be built here: {error}")
    return getattr(torch.ops, name).stock_seeds.default


@pytest.mark.parametrize(
    "out",
    [
        torch.empty(4, dtype=torch.float32),
        torch.empty(2, 2, dtype=torch.int64),
        torch.empty(8, dtype=torch.int64)[::2],
        torch.empty(4, dtype=torch.int64),
    ],
    ids=["float32", "2-D", "strided", "int64"],
)
def test_a_cpu_tensor_is_refused_by_the_dispatcher(
    op_without_device: Callable[[torch.Tensor], None], out: torch.Tensor
) -> None:
    """The op is registered for CUDA only (as vLLM's are): any CPU buffer is refused
    before the op runs; its own checks of CUDA buffers are tests/gpu/test_seed_kernel.py's."""
    with pytest.raises(NotImplementedError, match="with arguments from the 'CPU' backend"):
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
seed_kernel.build_library([(9, 0)], name="static_libstdcxx")
try:
    # A CUDA tensor: the op is registered for CUDA, and its own check formats the shape.
    out = torch.empty(2, 2, dtype=torch.int64, device="cuda")
    torch.ops.static_libstdcxx.stock_seeds.default(out)
except RuntimeError as error:
    print(str(error).splitlines()[0])
"""


@pytest.mark.skipif(
    cpp_extension.CUDA_HOME is None or COMPILER is None,
    reason="needs nvcc (CUDA_HOME) and a C++ compiler to build the op",
)
@pytest.mark.skipif(torch.version.cuda is None, reason="needs a CUDA build of torch")
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device: the op runs its checks only for CUDA tensors",
)
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
