# Lands in a vLLM source tree as tests/kernels/mamba/test_sr_seed_prefetcher.py
# (vllm_patch/fork_test.py), for the reset design.

# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""SRSeedPrefetcher without CUDA: when a forward's seeds are drawn, which call
takes which seed, when a forward is closed, and what a FULL graph's replay draws."""

from typing import cast

import pytest
import torch

from vllm.model_executor.layers.mamba.ops.sr_seed_prefetch import (
    SeedPrefetch,
    SRSeedPrefetcher,
)

NUM_SEEDS = 3


class FakeBatch:
    """A forward's seeds 100 * forward + k, taken in order."""

    def __init__(self, forward: int) -> None:
        self.seeds = [torch.tensor([100 * forward + k]) for k in range(NUM_SEEDS)]
        self.consumed = 0
        self.under_capture: bool | None = None

    def take(self) -> torch.Tensor | None:
        if self.consumed == NUM_SEEDS:
            return None
        self.consumed += 1
        return self.seeds[self.consumed - 1]


class FakePrefetch:
    """Records the batches it schedules and the ones it is told are finished."""

    def __init__(self) -> None:
        self.scheduled: list[FakeBatch] = []
        self.finished: list[tuple[FakeBatch, bool]] = []
        self.filled: list[int] = []

    def schedule(self) -> FakeBatch:
        self.scheduled.append(FakeBatch(len(self.scheduled)))
        return self.scheduled[-1]

    def fill(self, count: int) -> None:
        self.filled.append(count)

    def finish(self, batch: FakeBatch, full_cudagraph: bool = False) -> None:
        self.finished.append((batch, full_cudagraph))


@pytest.fixture
def prefetch() -> FakePrefetch:
    return FakePrefetch()


@pytest.fixture
def prefetcher(prefetch: FakePrefetch) -> SRSeedPrefetcher:
    return SRSeedPrefetcher(cast(SeedPrefetch, prefetch))


def _values(prefetcher: SRSeedPrefetcher, calls: int) -> list[int | None]:
    seeds = [prefetcher.next_seed() for _ in range(calls)]
    return [None if seed is None else int(seed.item()) for seed in seeds]


def test_outside_a_forward_every_call_draws_inline(
    prefetch: FakePrefetch, prefetcher: SRSeedPrefetcher
) -> None:
    assert _values(prefetcher, 2) == [None, None]
    assert prefetch.scheduled == []


def test_a_forward_draws_as_it_begins_and_hands_out_seed_k(
    prefetch: FakePrefetch, prefetcher: SRSeedPrefetcher
) -> None:
    for forward in range(2):
        with prefetcher.forward():
            assert len(prefetch.scheduled) == forward + 1
            # Beyond N, calls draw inline.
            assert _values(prefetcher, NUM_SEEDS + 1) == [
                100 * forward + k for k in range(NUM_SEEDS)
            ] + [None]
        assert [batch for batch, _ in prefetch.finished] == prefetch.scheduled
    assert _values(prefetcher, 1) == [None]


def test_a_full_cudagraph_forward_draws_as_it_begins(
    prefetch: FakePrefetch, prefetcher: SRSeedPrefetcher
) -> None:
    """Before V1's capture and replay alike: the graph itself draws nothing."""
    with prefetcher.forward(full_cudagraph=True):
        assert len(prefetch.scheduled) == 1
    assert prefetch.finished == [(prefetch.scheduled[0], True)]


def test_a_replay_draws_what_its_graph_captured(
    prefetch: FakePrefetch, prefetcher: SRSeedPrefetcher
) -> None:
    """V2: a forward begun inside the capture of graph "a" records what it
    took; a replay of "a" draws as many, one of any other graph none."""
    with prefetcher.forward(captures="a"):
        prefetch.scheduled[-1].under_capture = True
        _values(prefetcher, 2)
    with prefetcher.forward(captures="b"):  # a warm-up: not inside a capture
        prefetch.scheduled[-1].under_capture = False
        _values(prefetcher, NUM_SEEDS)
    for graph in ("a", "b", "c"):
        prefetcher.replay(graph)
    assert prefetch.filled == [2]


def test_a_forward_that_raises_is_finished(
    prefetch: FakePrefetch, prefetcher: SRSeedPrefetcher
) -> None:
    """So a capture that fails is rewound as one that ends."""
    with pytest.raises(KeyError), prefetcher.forward(full_cudagraph=True):
        _values(prefetcher, 1)
        raise KeyError("from the model")
    assert prefetch.finished == [(prefetch.scheduled[0], True)]
    assert _values(prefetcher, 1) == [None]
