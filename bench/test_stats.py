"""Quartiles, percentile intervals and the paired bootstrap of medians."""

from __future__ import annotations

import random
import statistics

import pytest

from .stats import (
    bootstrap_medians,
    interval_of,
    overlap,
    percentile_interval,
    quantile,
    quartiles,
    seeded_rng,
)


def test_quantile_interpolates_as_numpy_does():
    values = [1.0, 2.0, 3.0, 4.0]
    assert quantile(values, 0.0) == 1.0 and quantile(values, 1.0) == 4.0
    assert quantile(values, 0.25) == 1.75 and quantile(values, 0.5) == 2.5
    assert quantile([5.0], 0.9) == 5.0
    data = sorted(random.Random(3).random() for _ in range(37))
    assert statistics.quantiles(data, n=4, method="inclusive") == pytest.approx(
        [quantile(data, q) for q in (0.25, 0.5, 0.75)]
    )
    with pytest.raises(ValueError):
        quantile([], 0.5)
    with pytest.raises(ValueError):
        quantile(values, 1.5)


def test_quartiles_and_percentile_interval():
    assert quartiles([]) is None
    assert quartiles([4.0, 1.0, 3.0, 2.0]) == (1.75, 3.25)
    assert percentile_interval(list(range(101)), 0.9) == pytest.approx((5.0, 95.0))


def test_overlap():
    assert overlap((1.0, 2.0), (2.0, 3.0)) and overlap((1.0, 5.0), (2.0, 3.0))
    assert not overlap((1.0, 2.0), (2.5, 3.0)) and not overlap((2.5, 3.0), (1.0, 2.0))


def test_seeded_rng_is_stable_and_named():
    assert seeded_rng(0, "graph", "bs1").random() == seeded_rng(0, "graph", "bs1").random()
    assert seeded_rng(0, "graph", "bs1").random() != seeded_rng(0, "graph", "bs2").random()


def test_bootstrap_pairs_rounds_and_is_reproducible():
    rng = random.Random(5)
    a = [rng.gauss(100, 5) for _ in range(40)]
    samples = {"a": a, "same": list(a), "double": [2 * x for x in a], "none": []}
    boot = bootstrap_medians(samples, rng=seeded_rng(0, "t"), resamples=200)
    assert set(boot) == {"a", "same", "double"}
    assert all(len(medians) == 200 for medians in boot.values())
    # Paired: each resample takes the same rounds for every name.
    assert boot["a"] == boot["same"]
    assert boot["double"] == pytest.approx([2 * m for m in boot["a"]])
    assert interval_of([boot["double"], boot["a"]], lambda d, x: d / x) == pytest.approx((2.0, 2.0))
    assert boot == bootstrap_medians(samples, rng=seeded_rng(0, "t"), resamples=200)
    low, high = percentile_interval(boot["a"])
    assert low < statistics.median(a) < high


def test_bootstrap_of_unequal_lengths_resamples_each_alone():
    boot = bootstrap_medians(
        {"a": [1.0, 2.0, 3.0], "b": [1.0, 2.0]}, rng=random.Random(0), resamples=50
    )
    assert len(boot["a"]) == len(boot["b"]) == 50
    with pytest.raises(ValueError):
        bootstrap_medians({"a": [1.0]}, rng=random.Random(0), resamples=0)


def test_interval_of_an_undefined_figure_is_none():
    assert interval_of([[1.0, 2.0]], lambda x: None if x > 1.5 else x) is None
    assert interval_of([[1.0, 2.0]], lambda x: x) == (1.025, 1.975)
