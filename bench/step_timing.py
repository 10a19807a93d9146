"""Interleaved timing: every variant measured in turn, round after round.

Clocks, thermals and other tenants drift over a run.  Timing variant A for a
minute and then variant B would fold that drift into A - B; timing rounds of
A B C ... instead spreads it over every variant alike (each round times every
variant once), and the median over rounds drops the rounds a hiccup spoiled.

Within a round the order is shuffled afresh, from a `random.Random` the caller
seeds, so that no variant mostly runs right after the same neighbour (whose
leftovers, a warm cache or a queued launch, would then follow it); the same
seed gives the same orders, so a run can be repeated as it was (a cyclic
rotation would keep each variant behind the same neighbour in all rounds
but one in every N).

The orchestration (`interleaved`) takes its clock as an argument and is
unit-tested with a fake one; the CUDA clocks live beside it.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch

Step = Callable[[], None]
"""Enqueues one decode step (an eager forward, or a graph replay)."""
BurstTimer = Callable[[Step, int], float]
"""Runs a step n times; returns µs per step."""


def shuffled(names: Sequence[str], rng: random.Random) -> list[str]:
    """The order of one round: every name once, in an order drawn from `rng`."""
    order = list(names)
    rng.shuffle(order)
    return order


def interleaved(
    steps: Mapping[str, Step],
    *,
    rounds: int,
    burst: int,
    timer: BurstTimer,
    rng: random.Random,
    warmup: int = 1,
) -> dict[str, list[float]]:
    """`rounds` samples per step, taken in rounds of all of them, each round shuffled by `rng`.

    Each sample is `timer(step, burst)`; sample r of every step comes from
    round r, which is what lets the summary pair them.  `warmup` untimed
    bursts per step come first, in the steps' order, so that lazy
    initialisation (allocator growth, cuBLAS handles, JIT modules) lands in no
    sample.
    """
    if rounds < 1 or burst < 1:
        raise ValueError(f"rounds and burst must be positive, got {rounds} and {burst}")
    names = list(steps)
    samples: dict[str, list[float]] = {name: [] for name in names}
    if not names:
        return samples
    for _ in range(warmup):
        for name in names:
            timer(steps[name], burst)
    for _ in range(rounds):
        for name in shuffled(names, rng):
            samples[name].append(timer(steps[name], burst))
    return samples


@contextmanager
def gc_paused() -> Iterator[None]:
    """No garbage collection inside: a collection in one sample would be noise, not cost."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def device_us_per_step(step: Step, steps: int) -> float:
    """Device time of `steps` back-to-back steps, per step, from CUDA events on the current stream.

    The GPU is idle when the start event is recorded (the previous sample
    ended with a synchronize), and the steps are enqueued back to back as a
    serving loop does, so this is the step time a user sees: in eager mode it
    includes the gaps where the GPU waits for the host's launches, under CUDA
    graphs it is the replay time.  Side-stream work of a step is joined into
    the current stream by the step's own waits, so the end event covers it.
    """
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / steps


def host_us_per_step(step: Step, steps: int) -> float:
    """Host time to enqueue `steps` steps onto an idle device, per step, without waiting for them.

    Synchronizes before (so no earlier work can block a launch) and after (so
    the next sample starts idle), outside the timed span.
    """
    torch.cuda.synchronize()
    start = time.perf_counter_ns()
    for _ in range(steps):
        step()
    elapsed_ns = time.perf_counter_ns() - start
    torch.cuda.synchronize()
    return elapsed_ns / 1000.0 / steps
