"""The host cost per call of what the seed prefetcher asks torch on every SSU call
(runner_hooks/core/prefetch.py): whether the current stream is capturing, and the
current stream's handle, through torch's public API and its private one.

    pytest bench/test_torch_api_cost.py --benchmark-only -s

One pytest-benchmark round times each call 1000 times, the four interleaved (in
an order that rotates round by round); `extra_info` holds each call's median and
quartiles in ns over the rounds, and -s prints them.
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


def per_call_ns(call: Callable[[int], object], device: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(REPEATS):
        call(device)
    return (time.perf_counter_ns() - start) / REPEATS


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_per_call_cost(benchmark) -> None:
    device = torch.cuda.current_device()
    names = list(CALLS)
    samples: dict[str, list[float]] = {name: [] for name in names}
    rounds = iter(range(10**9))

    def one_round() -> None:
        k = next(rounds) % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(per_call_ns(CALLS[name], device))

    benchmark.pedantic(one_round, rounds=300, warmup_rounds=20)
    for name in names:
        values = samples[name][20:]  # the warm-up rounds' samples are dropped
        q1, median, q3 = statistics.quantiles(values, n=4)
        benchmark.extra_info[name] = {"median_ns": median, "q1_ns": q1, "q3_ns": q3}
        print(f"{name}: median {median:.0f} ns (IQR {q1:.0f}-{q3:.0f}), {len(values)} rounds")
