# Lands in a vLLM source tree as tests/kernels/mamba/test_sr_seed_prefetcher.py
# (vllm_patch/fork_test.py), for the reset design.

# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""SRSeedPrefetcher without CUDA: when a forward's seeds are drawn, which call
takes which seed, and when a forward is closed."""

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

    def take(self) -> torch.Tensor | None:
        if self.consumed == NUM_SEEDS:
            return None
        self.consumed += 1
        return self.seeds[self.consumed - 1]


class FakePrefetch:
    """Records the batches it schedules and the ones it is told are finished."""

    def __init__(self) -> None:
        self.scheduled: list[FakeBatch] = []
        self.finished: list[FakeBatch] = []

    def schedule(self) -> FakeBatch:
        self.scheduled.append(FakeBatch(len(self.scheduled)))
        return self.scheduled[-1]

    def finish(self, batch: FakeBatch) -> None:
        self.finished.append(batch)


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
        assert prefetch.finished == prefetch.scheduled
    assert _values(prefetcher, 1) == [None]


def test_a_full_cudagraph_forward_draws_at_its_first_call(
    prefetch: FakePrefetch, prefetcher: SRSeedPrefetcher
) -> None:
    with prefetcher.forward(full_cudagraph=True):
        assert prefetch.scheduled == []
        assert _values(prefetcher, 2) == [0, 1]
    assert prefetch.finished == prefetch.scheduled
    # One that calls no SSU draws nothing.
    with prefetcher.forward(full_cudagraph=True):
        pass
    assert len(prefetch.scheduled) == 1


def test_a_forward_that_raises_is_dropped_unfinished(
    prefetch: FakePrefetch, prefetcher: SRSeedPrefetcher
) -> None:
    with pytest.raises(KeyError), prefetcher.forward():
        _values(prefetcher, 1)
        raise KeyError("from the model")
    assert prefetch.finished == []
    assert _values(prefetcher, 1) == [None]
