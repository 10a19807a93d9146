"""KernelDrawer against real stock draws on a GPU.

Every check replays one generator state twice, once through N stock
`torch.randint(0, 2**32, (1,))` calls and once through the kernel, and asserts
the int64 values and the generator state left behind are exactly equal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from bench.drawers import SeedDrawer, stock_seed
from runner_hooks.core import seed_kernel
from runner_hooks.core.seed_kernel import KernelDrawer, SeedKernelUnavailable

from ..child import run_child

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", 0)
SEEDS = (0, 1, 42, 2**32 + 5, 2**63 - 1)


@pytest.fixture(scope="module")
def drawer() -> SeedDrawer:
    torch.cuda.init()
    try:
        return KernelDrawer()
    except SeedKernelUnavailable as error:
        pytest.skip(f"seed kernel unavailable: {error}")


def generator(device: torch.device = DEV) -> torch.Generator:
    """The device's default CUDA generator, the one stock draws from."""
    return torch.cuda.default_generators[device.index]


def stock_draws(n: int, device: torch.device = DEV) -> torch.Tensor:
    return torch.cat([stock_seed(device) for _ in range(n)])


def kernel_draws(drawer: SeedDrawer, n: int, device: torch.device = DEV) -> torch.Tensor:
    out = torch.empty(n, dtype=torch.int64, device=device)
    drawer.draw(out)
    return out


def stock_then_rewind(n: int, device: torch.device = DEV) -> tuple[torch.Tensor, torch.Tensor]:
    """n stock draws and the generator state they leave; the generator is then put back."""
    start = generator(device).get_state()
    values = stock_draws(n, device)
    end = generator(device).get_state()
    generator(device).set_state(start)
    return values, end


def assert_matches_stock(drawer: SeedDrawer, n: int, device: torch.device = DEV) -> None:
    expected, stock_end = stock_then_rewind(n, device)
    assert torch.equal(kernel_draws(drawer, n, device), expected)
    assert torch.equal(generator(device).get_state(), stock_end)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [1, 2, 40, 1000])
def test_eager_matches_stock(drawer: SeedDrawer, seed: int, n: int) -> None:
    generator().manual_seed(seed)
    assert_matches_stock(drawer, n)


@pytest.mark.parametrize("offset", [4, 2**34 - 80, 2**62])
def test_large_offsets_match_stock(drawer: SeedDrawer, offset: int) -> None:
    """Offsets past 32 bits; 2**34 - 80 makes the 40 draws carry across Philox counter words."""
    generator().manual_seed(3)
    generator().set_offset(offset)
    assert_matches_stock(drawer, 40)


def test_consecutive_draws_continue_the_stock_sequence(drawer: SeedDrawer) -> None:
    generator().manual_seed(8)
    expected, stock_end = stock_then_rewind(1 + 40 + 7)
    got = torch.cat([kernel_draws(drawer, n) for n in (1, 40, 7)])
    assert torch.equal(got, expected)
    assert torch.equal(generator().get_state(), stock_end)


def test_empty_buffer_draws_nothing(drawer: SeedDrawer) -> None:
    generator().manual_seed(9)
    start = generator().get_state()
    kernel_draws(drawer, 0)
    assert torch.equal(generator().get_state(), start)


def test_other_rng_use_sees_the_generator_where_stock_leaves_it(drawer: SeedDrawer) -> None:
    def session(draw: Callable[[int], torch.Tensor]) -> list[torch.Tensor]:
        generator().manual_seed(7)
        return [
            torch.rand(1001, device=DEV),
            draw(40),
            torch.randn(3, device=DEV),
            torch.randint(0, 10, (5,), device=DEV),
            draw(1),
            torch.rand(17, device=DEV),
            generator().get_state(),
        ]

    stock = session(stock_draws)
    kernel = session(lambda n: kernel_draws(drawer, n))
    for stock_value, kernel_value in zip(stock, kernel, strict=True):
        assert torch.equal(kernel_value, stock_value)


def test_draws_from_outs_device_generator(drawer: SeedDrawer) -> None:
    generator().manual_seed(11)
    expected, _ = stock_then_rewind(40)
    start = generator().get_offset()
    out = torch.empty(40, dtype=torch.int64, device="cuda:0")
    drawer.draw(out)
    assert torch.equal(out, expected)
    assert generator().get_offset() == start + 4 * 40


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_other_device_than_the_current_one(drawer: SeedDrawer) -> None:
    other = torch.device("cuda", 1)
    generator(DEV).manual_seed(3)
    generator(other).manual_seed(4)
    untouched = generator(DEV).get_state()
    with torch.cuda.device(DEV):
        assert_matches_stock(drawer, 40, other)
    assert torch.equal(generator(DEV).get_state(), untouched)


def test_draws_on_the_current_stream(drawer: SeedDrawer) -> None:
    """A side stream's draw finishes while the default stream is still busy."""
    kernel_draws(drawer, 1)  # the kernel is loaded before the default stream is made busy
    generator().manual_seed(5)
    expected, stock_end = stock_then_rewind(40)
    out = torch.empty(40, dtype=torch.int64, device=DEV)
    main = torch.cuda.current_stream(DEV)
    side = torch.cuda.Stream(DEV)
    side.wait_stream(main)
    torch.cuda._sleep(2_000_000_000)  # about a second of the default stream
    with torch.cuda.stream(side):
        drawer.draw(out)
    side.synchronize()
    assert not main.query(), "the draw waited for the default stream"
    main.synchronize()
    assert torch.equal(out, expected)
    assert torch.equal(generator().get_state(), stock_end)


def test_cuda_graph_replays_match_stock_graph(drawer: SeedDrawer) -> None:
    n, replays = 40, 3
    generator().manual_seed(99)
    stock_draws(n)
    kernel_draws(drawer, n)  # warm both outside capture

    stock_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(stock_graph):
        stock_out = stock_draws(n)
    kernel_graph = torch.cuda.CUDAGraph()
    kernel_out = torch.empty(n, dtype=torch.int64, device=DEV)
    with torch.cuda.graph(kernel_graph):
        drawer.draw(kernel_out)

    def replay(graph: torch.cuda.CUDAGraph, out: torch.Tensor) -> list[torch.Tensor]:
        values = []
        for _ in range(replays):
            graph.replay()
            values.append(out.clone())
        return values

    start = generator().get_state()
    stock_values = replay(stock_graph, stock_out)
    stock_end = generator().get_state()
    generator().set_state(start)
    kernel_values = replay(kernel_graph, kernel_out)
    assert torch.equal(generator().get_state(), stock_end)
    for stock_value, kernel_value in zip(stock_values, kernel_values, strict=True):
        assert torch.equal(kernel_value, stock_value)
    assert len({tuple(value.tolist()) for value in kernel_values}) == replays, "replays repeat"
    generator().set_state(start)
    assert torch.equal(torch.cat(kernel_values), stock_draws(replays * n))


def test_threads_reserve_offsets_atomically(drawer: SeedDrawer) -> None:
    """Two threads drawing at once get disjoint whole blocks of the stock sequence."""
    n, rounds, threads = 40, 200, 2
    generator().manual_seed(2024)
    start = generator().get_state()
    buffers = [torch.empty(rounds, n, dtype=torch.int64, device=DEV) for _ in range(threads)]
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def work(buffer: torch.Tensor) -> None:
        try:
            barrier.wait()
            for row in buffer:
                drawer.draw(row)
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=work, args=(buffer,)) for buffer in buffers]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    torch.cuda.synchronize(DEV)
    assert not errors
    kernel_end = generator().get_state()

    generator().set_state(start)
    stock = stock_draws(threads * rounds * n)
    assert torch.equal(kernel_end, generator().get_state())
    block_index = {block: i for i, block in enumerate(map(tuple, stock.view(-1, n).tolist()))}
    per_thread = [[block_index.get(tuple(row), -1) for row in b.tolist()] for b in buffers]
    assert sorted(i for blocks in per_thread for i in blocks) == list(range(threads * rounds))
    for blocks in per_thread:
        assert blocks == sorted(blocks), "a thread's draws came out of order"


REJECT_CHILD = """
import sys
import torch
from runner_hooks.core.seed_kernel import stock_seeds_op
op = stock_seeds_op()
out = {make}
start = torch.cuda.default_generators[0].get_state()
try:
    op(out)
except RuntimeError as error:
    print(str(error).splitlines()[0])
else:
    sys.exit("the op took the buffer")
assert torch.equal(torch.cuda.default_generators[0].get_state(), start), "the op drew"
"""


@pytest.mark.parametrize(
    ("make", "message"),
    [
        ('torch.empty(4, dtype=torch.int32, device="cuda:0")', "must be int64"),
        ('torch.empty(2, 2, dtype=torch.int64, device="cuda:0")', "must be 1-D"),
        ('torch.empty(8, dtype=torch.int64, device="cuda:0")[::2]', "must be contiguous"),
        # Registered for CUDA only: the dispatcher refuses a CPU buffer.
        ("torch.empty(4, dtype=torch.int64)", "with arguments from the 'CPU' backend"),
    ],
    ids=["int32", "2-D", "strided", "cpu"],
)
def test_rejects_bad_buffers_before_drawing(drawer: SeedDrawer, make: str, message: str) -> None:
    """Each case in a fresh process (on the build `drawer` made), so that a crash in
    the op's error path fails that case and not the rest of the session."""
    child = run_child(REJECT_CHILD.format(make=make), timeout=120)
    assert child.returncode == 0, f"exit status {child.returncode}: {child.stderr[-2000:]}"
    assert message in child.stdout, child.stdout


def test_second_load_reuses_the_op(drawer: SeedDrawer, monkeypatch: pytest.MonkeyPatch) -> None:
    op = seed_kernel.stock_seeds_op()

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("the op was built again")

    monkeypatch.setattr(seed_kernel.cpp_extension, "load", no_build)
    assert seed_kernel.stock_seeds_op() is op
    generator().manual_seed(1)
    assert_matches_stock(KernelDrawer(), 3)


CHILD = """
import time
import torch
start = time.perf_counter()
from runner_hooks.core.seed_kernel import stock_seeds_op
op = stock_seeds_op()
elapsed = time.perf_counter() - start
op(torch.empty(3, dtype=torch.int64, device="cuda:0"))
torch.cuda.synchronize()
print(elapsed, *(p for p in torch.ops.loaded_libraries if "stock_seeds" in p))
"""


def test_fresh_process_loads_the_cached_build(drawer: SeedDrawer) -> None:
    """A new process finds the build in torch's cache: nothing compiled or linked again."""
    (library,) = (Path(p) for p in torch.ops.loaded_libraries if "stock_seeds" in p)
    assert library.is_file()
    built = sorted(p for p in library.parent.iterdir() if p.suffix in (".so", ".o"))
    assert len(built) >= 2, f"expected the library and its object file in {library.parent}"
    stamps = [p.stat().st_mtime_ns for p in built]

    child = run_child(CHILD, timeout=300)
    assert child.returncode == 0, child.stderr
    elapsed, loaded = child.stdout.split()[-2:]
    assert Path(loaded) == library
    assert [p.stat().st_mtime_ns for p in built] == stamps, "the fresh process rebuilt"
    assert float(elapsed) < 20, f"loading the cached build took {elapsed} s"


VLLM_CHILD = """
import importlib.util
import sys
import torch
from runner_hooks.core import seed_kernel
# As `sr-prefetch build-op` builds it for an installed vLLM: named _mamba_sr_C, so that
# TORCH_EXTENSION_NAME (the op's namespace) and PyInit__mamba_sr_C are vLLM's.
library = seed_kernel.build_library([torch.cuda.get_device_capability(0)],
                                    name="_mamba_sr_C", build_directory=sys.argv[1])
spec = importlib.util.spec_from_file_location("_mamba_sr_C", library)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)  # `import vllm._mamba_sr_C` does this
n = 40
torch.cuda.manual_seed(7)
stock = [int(torch.randint(0, 2**32, (1,), device="cuda").item()) for _ in range(n)]
torch.cuda.manual_seed(7)
out = torch.empty(n, dtype=torch.int64, device="cuda")
torch.ops._mamba_sr_C.stock_seeds(out)
assert out.tolist() == stock, (out.tolist()[:4], stock[:4])
print(module.__name__, torch.ops._mamba_sr_C.stock_seeds.default.name())
"""


def test_vllms_name_builds_an_importable_op_with_stock_values(tmp_path: Path) -> None:
    """Built as vLLM's _mamba_sr_C (build-op's name), the source makes a Python module
    (REGISTER_EXTENSION) whose op, torch.ops._mamba_sr_C.stock_seeds, draws stock's
    values: a build of its own beside runner_hooks'."""
    child = run_child(VLLM_CHILD, str(tmp_path), timeout=420)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.split()[-2:] == ["_mamba_sr_C", "_mamba_sr_C::stock_seeds"]
