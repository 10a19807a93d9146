"""The Triton seed draw (runner_hooks/core/randint_seeds.py) against torch on a GPU.

Each check draws from one generator state twice, through stock's
`torch.randint(0, 2**32, (1,))` calls and through the kernel, and asserts the int64
values and the generator state left behind are exactly equal.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from bench.drawers import stock_seed

from ..randint_pairs import pairs

triton = pytest.importorskip("triton", reason="the Triton draw needs triton")
from runner_hooks.core.randint_seeds import (  # noqa: E402
    fill_randint_seeds,
    randint_seeds_at,
)

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", 0)
PAIRS = 10_000
SEEDS_PER_PAIR = 40


@pytest.fixture(autouse=True, scope="module")
def cuda_initialized() -> None:
    """torch fills `default_generators` as CUDA initializes."""
    torch.cuda.init()


def generator(device: torch.device = DEV) -> torch.Generator:
    return torch.cuda.default_generators[device.index]


def stock_draws(n: int, device: torch.device = DEV) -> torch.Tensor:
    return torch.cat([stock_seed(device) for _ in range(n)])


def triton_draws(n: int, device: torch.device = DEV) -> torch.Tensor:
    out = torch.empty(n, dtype=torch.int64, device=device)
    fill_randint_seeds(out)
    return out


def stock_then_rewind(n: int, device: torch.device = DEV) -> tuple[torch.Tensor, torch.Tensor]:
    start = generator(device).get_state()
    values = stock_draws(n, device)
    end = generator(device).get_state()
    generator(device).set_state(start)
    return values, end


def assert_matches_stock(n: int, device: torch.device = DEV) -> None:
    expected, stock_end = stock_then_rewind(n, device)
    assert torch.equal(triton_draws(n, device), expected)
    assert torch.equal(generator(device).get_state(), stock_end)


def test_ten_thousand_pairs_match_torch() -> None:
    """40 seeds from each of 10**4 (seed, offset) pairs, the edge cases included."""
    cases = pairs(PAIRS)
    stock = []
    for seed, offset in cases:
        generator().manual_seed(seed)
        generator().set_offset(offset)
        stock.append(stock_draws(SEEDS_PER_PAIR))
        assert generator().get_offset() == offset + 4 * SEEDS_PER_PAIR
    expected = torch.stack(stock)
    got = torch.empty_like(expected)
    for row, (seed, offset) in zip(got, cases, strict=True):
        randint_seeds_at(row, seed, offset)
    mismatched = (got != expected).any(dim=1).nonzero().flatten().tolist()
    assert not mismatched, [cases[i] for i in mismatched[:10]]


def test_the_comparison_can_fail() -> None:
    """The control: the counter one draw on gives other values."""
    seed, offset = pairs(1)[0]
    generator().manual_seed(seed)
    generator().set_offset(offset)
    expected = stock_draws(SEEDS_PER_PAIR)
    got = torch.empty_like(expected)
    randint_seeds_at(got, seed, offset + 4)
    assert not torch.equal(got, expected)
    assert torch.equal(got[:-1], expected[1:])


@pytest.mark.parametrize("seed", [0, 1, 42, 2**32 + 5, 2**63 - 1, 2**64 - 1])
@pytest.mark.parametrize("n", [1, 2, 40, 129, 1000])
def test_fill_matches_stock(seed: int, n: int) -> None:
    """Values and the generator's state; 129 and 1000 take more than one program."""
    generator().manual_seed(seed)
    assert_matches_stock(n)


@pytest.mark.parametrize("offset", [4, 4 * (2**32 - 20), 2**62])
def test_fill_at_large_offsets(offset: int) -> None:
    """Offsets past 32 bits, and one whose 40 draws carry into the high word."""
    generator().manual_seed(3)
    generator().set_offset(offset)
    assert_matches_stock(40)


def test_torch_keeps_the_offset_a_multiple_of_four() -> None:
    """What the kernel's counter, offset / 4, relies on."""
    with pytest.raises(RuntimeError, match="multiple of 4"):
        generator().set_offset(6)


def test_consecutive_fills_continue_the_stock_sequence() -> None:
    generator().manual_seed(8)
    expected, stock_end = stock_then_rewind(1 + 40 + 7)
    got = torch.cat([triton_draws(n) for n in (1, 40, 7)])
    assert torch.equal(got, expected)
    assert torch.equal(generator().get_state(), stock_end)


def test_empty_buffer_draws_nothing() -> None:
    generator().manual_seed(9)
    start = generator().get_state()
    triton_draws(0)
    assert torch.equal(generator().get_state(), start)


def test_other_rng_use_sees_the_generator_where_stock_leaves_it() -> None:
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
    ours = session(triton_draws)
    for stock_value, our_value in zip(stock, ours, strict=True):
        assert torch.equal(our_value, stock_value)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_draws_from_outs_device_generator() -> None:
    other = torch.device("cuda", 1)
    generator(DEV).manual_seed(3)
    generator(other).manual_seed(4)
    untouched = generator(DEV).get_state()
    with torch.cuda.device(DEV):
        assert_matches_stock(40, other)
    assert torch.equal(generator(DEV).get_state(), untouched)


def test_draws_on_the_current_stream() -> None:
    """A side stream's draw finishes while the default stream is still busy."""
    triton_draws(1)  # compiled and loaded before the default stream is made busy
    generator().manual_seed(5)
    expected, stock_end = stock_then_rewind(40)
    out = torch.empty(40, dtype=torch.int64, device=DEV)
    main = torch.cuda.current_stream(DEV)
    side = torch.cuda.Stream(DEV)
    side.wait_stream(main)
    torch.cuda._sleep(2_000_000_000)  # about a second of the default stream
    with torch.cuda.stream(side):
        fill_randint_seeds(out)
    side.synchronize()
    assert not main.query(), "the draw waited for the default stream"
    main.synchronize()
    assert torch.equal(out, expected)
    assert torch.equal(generator().get_state(), stock_end)
