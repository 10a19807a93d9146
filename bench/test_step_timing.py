"""Interleaving: rounds of every step, shuffled by a seeded generator, warmed up, `rounds` each."""

from __future__ import annotations

import gc
import random
from collections import Counter

import pytest

from .step_timing import gc_paused, interleaved, shuffled

NAMES = [f"v{index}" for index in range(11)]


def test_shuffled_is_a_permutation_and_reproducible():
    first = [shuffled(NAMES, random.Random(7)) for _ in range(3)]
    assert all(sorted(order) == sorted(NAMES) for order in first)
    assert first == [shuffled(NAMES, random.Random(7)) for _ in range(3)]
    rng = random.Random(7)
    assert len({tuple(shuffled(NAMES, rng)) for _ in range(20)}) > 1


def calls_of(rounds: int, rng: random.Random, names=NAMES) -> list[str]:
    calls: list[str] = []
    steps = {name: (lambda name=name: calls.append(name)) for name in names}

    def timer(step, burst):
        before = len(calls)
        for _ in range(burst):
            step()
        return float(len(calls) - before)

    samples = interleaved(steps, rounds=rounds, burst=2, timer=timer, rng=rng, warmup=1)
    assert samples == {name: [2.0] * rounds for name in names}
    return calls[::2]


def test_every_round_times_every_step_once_warmup_first():
    order = calls_of(5, random.Random(0), ["a", "b", "c"])
    assert order[:3] == ["a", "b", "c"]  # warm-up, in the steps' order
    rounds = [order[start : start + 3] for start in range(3, len(order), 3)]
    assert len(rounds) == 5 and all(sorted(one) == ["a", "b", "c"] for one in rounds)


def test_same_seed_same_orders_and_no_fixed_neighbour():
    rounds = 50
    order = calls_of(rounds, random.Random(0))[len(NAMES) :]
    assert order == calls_of(rounds, random.Random(0))[len(NAMES) :]
    assert order != calls_of(rounds, random.Random(1))[len(NAMES) :]
    # A cyclic rotation puts each step right after the same neighbour in all rounds
    # but one in every len(NAMES); shuffled, no neighbour comes close to that.
    for name in NAMES:
        before = Counter(
            order[index - 1]
            for index in range(len(order))
            if order[index] == name and index % len(NAMES)
        )
        assert max(before.values()) < rounds // 4, (name, before)
    # And every step takes several places within its round.
    for name in NAMES:
        places = {
            order.index(name, start, start + len(NAMES)) - start
            for start in range(0, len(order), len(NAMES))
        }
        assert len(places) >= 5, (name, places)


def test_interleaved_refuses_nonsense_and_accepts_nothing():
    rng = random.Random(0)
    with pytest.raises(ValueError):
        interleaved({"a": lambda: None}, rounds=0, burst=1, timer=lambda step, n: 0.0, rng=rng)
    assert interleaved({}, rounds=2, burst=1, timer=lambda step, n: 0.0, rng=rng) == {}


def test_gc_paused_restores_the_collector():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
