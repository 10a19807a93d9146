"""The host cost per call of what the seed prefetcher asks torch: on every SSU call
(runner_hooks/core/prefetch.py), whether the current stream is capturing and the
current stream's handle, through torch's public API and its private one
(`test_per_call_cost`); once per forward, the draw of its seeds, beside one and 40
stock draws (`test_seed_draw_cost`).

    pytest bench/test_torch_api_cost.py --benchmark-only -s

One pytest-benchmark round times each call 1000 times (a draw 20 times), the calls
interleaved; `extra_info` holds each call's median and quartiles in ns over the
rounds, and -s prints them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import pytest
import torch

CALLS: dict[str, Callable[[int], object]] = {
    "torch.cuda.is_current_stream_capturing()": (
        lambda device: torch.cuda.is_current_stream_capturing()
    ),
    "torch._C._cuda_isCurrentStreamCapturing()": (
        lambda device: torch._C._cuda_isCurrentStreamCapturing()
    ),
    "torch.cuda.current_stream(i).cuda_stream": (
        lambda device: torch.cuda.current_stream(device).cuda_stream
    ),
    "torch._C._cuda_getCurrentRawStream(i)": (
        lambda device: torch._C._cuda_getCurrentRawStream(device)
    ),
}
REPEATS = 1000


def _stock_draws(device: int, n: int) -> None:
    for _ in range(n):
        torch.randint(0, 2**32, (1,), device=device)


def seed_draws(device: int) -> dict[str, Callable[[int], object]]:
    """The reset design's draw of a forward's 40 seeds (runner_hooks.core.randint_seeds),
    its Triton launch alone, floor-rng's one stock draw, and stock's 40."""
    from runner_hooks.core.randint_seeds import fill_randint_seeds, randint_seeds_at

    out = torch.empty(40, dtype=torch.int64, device=device)
    generator = torch.cuda.default_generators[device]
    return {
        "fill_randint_seeds(40 seeds)": lambda device: fill_randint_seeds(out),
        "the Triton launch alone (randint_seeds_at)": (
            lambda device: randint_seeds_at(out, generator.initial_seed(), 0)
        ),
        "torch.randint(0, 2**32, (1,)), floor-rng's draw": (
            lambda device: torch.randint(0, 2**32, (1,), device=device)
        ),
        "40 x torch.randint(0, 2**32, (1,)), stock's": lambda device: _stock_draws(device, 40),
    }


def per_call_ns(call: Callable[[int], object], device: int, repeats: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(repeats):
        call(device)
    return (time.perf_counter_ns() - start) / repeats


def interleaved_costs(
    benchmark, calls: dict[str, Callable[[int], object]], device: int, repeats: int
) -> None:
    """Each call's host ns per call over 300 rounds, the calls interleaved (in an order
    that rotates round by round, the GPU drained between rounds); the medians and
    quartiles go to `extra_info` and stdout."""
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    rounds = iter(range(10**9))

    def one_round() -> None:
        k = next(rounds) % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(per_call_ns(calls[name], device, repeats))
            torch.cuda.synchronize(device)

    benchmark.pedantic(one_round, rounds=300, warmup_rounds=20)
    for name in names:
        values = samples[name][20:]  # the warm-up rounds' samples are dropped
        q1, median, q3 = statistics.quantiles(values, n=4)
        benchmark.extra_info[name] = {"median_ns": median, "q1_ns": q1, "q3_ns": q3}
        print(f"{name}: median {median:.0f} ns (IQR {q1:.0f}-{q3:.0f}), {len(values)} rounds")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_per_call_cost(benchmark) -> None:
    interleaved_costs(benchmark, CALLS, torch.cuda.current_device(), REPEATS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_seed_draw_cost(benchmark) -> None:
    pytest.importorskip("triton", reason="the reset design's draw needs triton")
    device = torch.cuda.current_device()
    interleaved_costs(benchmark, seed_draws(device), device, repeats=20)
