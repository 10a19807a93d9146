"""The seed op built by a vLLM fork's CMake (tests/gpu/vllm/fork_build.sh): loaded as
vLLM loads it, `import vllm._mamba_sr_C`, it gives N stock draws' values and advance,
eagerly and over CUDA-graph replays. Skipped without SR_FORK_OP_LIBRARY."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not os.environ.get("SR_FORK_OP_LIBRARY"),
        reason="no fork-built op: SR_FORK_OP_LIBRARY names none (fork_build.sh sets it)",
    ),
]

N = 40


@pytest.fixture(scope="module")
def op():
    """`torch.ops._mamba_sr_C.stock_seeds`, registered by importing the library as
    the Python module `vllm._mamba_sr_C` (its PyInit is REGISTER_EXTENSION's)."""
    spec = importlib.util.spec_from_file_location(
        "vllm._mamba_sr_C", os.environ["SR_FORK_OP_LIBRARY"]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("vllm", type(sys)("vllm"))
    spec.loader.exec_module(module)
    return torch.ops._mamba_sr_C.stock_seeds


def stock(n: int) -> list[int]:
    return [int(torch.randint(0, 2**32, (1,), device="cuda").item()) for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 1234, 2**40 + 7])
def test_eager_values_and_advance_are_stocks(op, seed: int) -> None:
    torch.manual_seed(seed)
    expected, after = stock(N), stock(1)
    torch.manual_seed(seed)
    out = torch.empty(N, dtype=torch.int64, device="cuda")
    op(out)
    assert out.tolist() == expected
    assert stock(1) == after, "the generator is left where N stock draws leave it"


def test_a_wrong_seed_differs(op) -> None:
    """The control: another generator state gives other values."""
    torch.manual_seed(1)
    expected = stock(N)
    torch.manual_seed(2)
    out = torch.empty(N, dtype=torch.int64, device="cuda")
    op(out)
    assert out.tolist() != expected


def test_graph_replays_draw_fresh_stock_values(op) -> None:
    out = torch.empty(N, dtype=torch.int64, device="cuda")
    stock_out = torch.empty(N, dtype=torch.int64, device="cuda")
    ours, theirs = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(ours):
        op(out)
    with torch.cuda.graph(theirs):
        for k in range(N):
            stock_out[k : k + 1].copy_(torch.randint(0, 2**32, (1,), device="cuda"))
    seen = []
    for _ in range(3):
        torch.manual_seed(99)
        ours.replay()
        mine = out.tolist()
        torch.manual_seed(99)
        theirs.replay()
        assert mine == stock_out.tolist()
        seen.append(mine)
    torch.manual_seed(5)
    ours.replay()
    assert out.tolist() != seen[0]
