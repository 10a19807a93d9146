"""Interleaving: rounds of every step, rotated, warmed up, sampled `rounds` times each."""

from __future__ import annotations

import gc

import pytest

from .timing import gc_paused, interleaved, rotated


def test_rotated():
    assert rotated(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert rotated(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert rotated(["a", "b", "c"], 5) == ["c", "a", "b"]


def test_interleaved_rounds_alternate_and_rotate():
    calls: list[tuple[str, int]] = []
    steps = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}

    def timer(step, burst):
        before = len(calls)
        for _ in range(burst):
            step()
        return float(len(calls) - before)

    samples = interleaved(steps, rounds=3, burst=2, timer=timer, warmup=1)
    assert samples == {name: [2.0, 2.0, 2.0] for name in "abc"}
    order = calls[::2]
    assert order[:3] == ["a", "b", "c"]  # warm-up
    assert order[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_interleaved_refuses_nonsense_and_accepts_nothing():
    with pytest.raises(ValueError):
        interleaved({"a": lambda: None}, rounds=0, burst=1, timer=lambda step, n: 0.0)
    assert interleaved({}, rounds=2, burst=1, timer=lambda step, n: 0.0) == {}


def test_gc_paused_restores_the_collector():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
