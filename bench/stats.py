"""Spread of a median: quartiles, and percentile-bootstrap confidence intervals over rounds.

Pure Python (no numpy: the CPU tests' environment need not have it), and
deterministic: every bootstrap draws from a `random.Random` seeded from a
fixed seed and the name of what it resamples, so a summary written twice from
the same samples is the same, whichever other cells it holds.

Samples of one interleaved pass are paired: sample r of every variant was
taken in round r, minutes apart from the others' sample r at most.  The
bootstrap resamples *rounds*, the same round indices for every variant, so a
figure computed from several medians (a ratio to stock, a recovered share) has
an interval that keeps what the variants of a round share (clock, thermals,
neighbours on the host) instead of counting it twice.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter

RESAMPLES = 2000
"""Bootstrap resamples per interval."""
CONFIDENCE = 0.95
"""Coverage of every interval."""
BOOTSTRAP_SEED = 0
"""The fixed seed the bootstrap's generators are derived from."""
MIN_SAMPLES = 10
"""Fewer samples than this get no interval: a bootstrap of a median of a handful
of values is mostly the handful, and its interval would look sharper than it is."""

Interval = tuple[float, float]


def quantile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, interpolated linearly (numpy's default, R's type 7)."""
    if not ordered:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    position = q * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    fraction = position - below
    return ordered[below] + (ordered[above] - ordered[below]) * fraction


def quartiles(samples: Sequence[float]) -> Interval | None:
    """(first quartile, third quartile) of the samples; their difference is the IQR."""
    if not samples:
        return None
    ordered = sorted(samples)
    return quantile(ordered, 0.25), quantile(ordered, 0.75)


def percentile_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The central `confidence` share of `values` (a bootstrap distribution)."""
    ordered = sorted(values)
    tail = (1.0 - confidence) / 2.0
    return quantile(ordered, tail), quantile(ordered, 1.0 - tail)


def overlap(a: Interval, b: Interval) -> bool:
    """Whether two closed intervals share a point."""
    return a[0] <= b[1] and b[0] <= a[1]


def seeded_rng(seed: int, *names: object) -> random.Random:
    """A generator for one named purpose, derived from `seed` (str seeds hash stably)."""
    return random.Random(":".join(map(str, (seed, *names))))


def _median_of_sorted(ordered: Sequence[float]) -> float:
    n = len(ordered)
    middle = n // 2
    return ordered[middle] if n % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0


def bootstrap_medians(
    samples: Mapping[str, Sequence[float]],
    *,
    rng: random.Random,
    resamples: int = RESAMPLES,
) -> dict[str, list[float]]:
    """`resamples` bootstrap medians per name, resample b of every name from the same draw.

    When every name has the same number of samples they are taken as paired
    by index (sample r of each from round r) and each resample draws one set
    of round indices for all of them.  Otherwise each name is resampled on its
    own.  Names without samples are left out.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be positive, got {resamples}")
    present = {name: list(values) for name, values in samples.items() if values}
    medians: dict[str, list[float]] = {name: [] for name in present}
    if not present:
        return medians
    lengths = {len(values) for values in present.values()}
    if len(lengths) == 1:
        (n,) = lengths
        rounds = range(n)
        for _ in range(resamples):
            picked = _picker(rng.choices(rounds, k=n))
            for name, values in present.items():
                medians[name].append(_median_of_sorted(sorted(picked(values))))
    else:
        for name, values in present.items():
            rounds = range(len(values))
            for _ in range(resamples):
                picked = _picker(rng.choices(rounds, k=len(values)))
                medians[name].append(_median_of_sorted(sorted(picked(values))))
    return medians


def _picker(indices: list[int]) -> Callable[[Sequence[float]], Sequence[float]]:
    """values -> [values[i] for i in indices], at C speed where there is more than one."""
    if len(indices) == 1:
        (index,) = indices
        return lambda values: (values[index],)
    return itemgetter(*indices)  # type: ignore[return-value]


def interval_of(
    distributions: Sequence[Sequence[float]],
    combine: Callable[..., float | None],
    confidence: float = CONFIDENCE,
) -> Interval | None:
    """The percentile interval of `combine` applied resample by resample.

    distributions: bootstrap medians of several names, resample b of each at
    index b (from one `bootstrap_medians`).  None when `combine` is undefined
    (returns None) for any resample: the figure then has no finite interval.
    """
    values = []
    for medians in zip(*distributions, strict=True):
        value = combine(*medians)
        if value is None:
            return None
        values.append(value)
    return percentile_interval(values, confidence) if values else None
