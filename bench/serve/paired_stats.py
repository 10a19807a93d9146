"""The statistics of paired runs, on the log scale: per pair d = ln(B / A) of one
per-request metric (e.g. mean ITL); within a run, mean d with a moving-block bootstrap
interval over consecutive pairs (so drift shared by neighbouring pairs widens it); across
runs, the mean of the run means with a Student t interval.  Intervals are of ln(B / A);
exp(x) - 1 reads one as a fraction.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.stats import quantile

LEVEL = 0.95
RESAMPLES = 2000
BOOTSTRAP_SEED = 0


class StatsError(ValueError):
    """The figures given cannot give the statistic asked for."""


class NotPaired(StatsError):
    def __init__(self, n_a: int, n_b: int) -> None:
        super().__init__(f"{n_a} A values against {n_b} B values: give one of each per pair")


class NotPositive(StatsError):
    def __init__(self, index: int, value: float) -> None:
        super().__init__(
            f"pair {index}: value {value!r} is not positive; a latency of 0 or less is a"
            " failed read: drop the pair"
        )


class TooFew(StatsError):
    def __init__(self, what: str, n: int, need: int) -> None:
        super().__init__(f"{n} {what} given, at least {need} needed: measure more {what}")


class BadArgument(StatsError):
    def __init__(self, name: str, value: object, expected: str) -> None:
        super().__init__(f"{name}={value!r}: give {expected}")


@dataclass(frozen=True)
class Interval:
    """A mean and its interval at `level`, all on the log scale."""

    mean: float
    low: float
    high: float
    level: float = LEVEL

    @property
    def width(self) -> float:
        return self.high - self.low

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def percent(self) -> tuple[float, float, float]:
        """(mean, low, high) as percent changes, exp(x) - 1."""
        mean, low, high = (100.0 * math.expm1(x) for x in (self.mean, self.low, self.high))
        return mean, low, high


def log_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """d = ln(b / a) per pair, in pair order."""
    if len(a) != len(b):
        raise NotPaired(len(a), len(b))
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        for value in (x, y):
            if not value > 0:
                raise NotPositive(i, value)
    return [math.log(y) - math.log(x) for x, y in zip(a, b, strict=True)]


def default_block(n: int) -> int:
    """About n^(1/3) pairs, at least 1."""
    return max(1, round(n ** (1 / 3)))


def block_bootstrap(
    d: Sequence[float],
    block: int | None = None,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = LEVEL,
) -> Interval:
    """Mean of d with a moving-block bootstrap percentile interval: each resample joins
    blocks of `block` consecutive pairs (default default_block(n)) drawn with replacement
    from the n - block + 1 starts, cut to n values; same inputs, same interval."""
    n = len(d)
    if n < 2:
        raise TooFew("pairs", n, 2)
    block = default_block(n) if block is None else block
    if not 1 <= block <= n:
        raise BadArgument("block", block, f"a block length from 1 to the {n} pairs")
    if not 0 < level < 1:
        raise BadArgument("level", level, "a level between 0 and 1, e.g. 0.95")
    rng = random.Random(seed)
    starts = n - block + 1
    prefix = [0.0]
    for x in d:
        prefix.append(prefix[-1] + x)
    whole, tail = divmod(n, block)
    means = []
    for _ in range(resamples):
        total = 0.0
        for _ in range(whole):
            s = rng.randrange(starts)
            total += prefix[s + block] - prefix[s]
        if tail:
            s = rng.randrange(starts)
            total += prefix[s + tail] - prefix[s]
        means.append(total / n)
    means.sort()
    alpha = 1 - level
    return Interval(
        statistics.fmean(d), quantile(means, alpha / 2), quantile(means, 1 - alpha / 2), level
    )


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1 - math.exp(log_front) * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection on t_cdf, to about 1e-12)."""
    if not 0 < p < 1 or not df > 0:
        raise BadArgument("p, df", (p, df), "0 < p < 1 and df > 0")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, 2 * high
    while high - low > 1e-12 * max(1.0, high):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def across_runs(run_means: Sequence[float], level: float = LEVEL) -> Interval:
    """The mean of the per-run means with a Student t interval (runs - 1 df)."""
    k = len(run_means)
    if k < 2:
        raise TooFew("runs", k, 2)
    mean = statistics.fmean(run_means)
    half = t_quantile(1 - (1 - level) / 2, k - 1) * statistics.stdev(run_means) / math.sqrt(k)
    return Interval(mean, mean - half, mean + half, level)


def offsets(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Each server's systematic offset in percent: the mean over pairs of ln(its value)
    less ln of the pair's geometric mean, as exp(x) - 1 (A's is -mean(d)/2, B's +)."""
    d = statistics.fmean(log_ratios(a, b))
    return {"A": 100.0 * math.expm1(-d / 2), "B": 100.0 * math.expm1(d / 2)}


def by_core_set(run_means: Sequence[float]) -> tuple[float, float]:
    """(server, cores) on the log scale from runs that swap core sets (pairing.assign:
    A on set r % 2): ln(B / A) the servers differ by and ln(set 1 / set 0)."""
    even, odd = run_means[0::2], run_means[1::2]
    if not even or not odd:
        raise TooFew("runs", len(run_means), 2)
    e, o = statistics.fmean(even), statistics.fmean(odd)
    return (e + o) / 2, (e - o) / 2


@dataclass(frozen=True)
class Decision:
    """Whether an A/A interval lets the A/B run go, and why."""

    go: bool
    reason: str
    width: float
    limit: float


def aa_decision(interval: Interval, effect: float) -> Decision:
    """Go when the A/A interval holds 0 and is narrower than ln(1 + effect) / 2, half the
    predicted effect (a fraction, e.g. 0.03) on the log scale."""
    if not effect > 0:
        raise BadArgument("effect", effect, "the predicted effect as a positive fraction")
    limit = math.log1p(effect) / 2
    width = interval.width
    if not interval.contains(0.0):
        reason = "the A/A interval excludes 0: the servers differ by themselves; find why first"
    elif width >= limit:
        reason = f"the A/A interval is {width:.4f} wide, not under {limit:.4f}: add pairs or runs"
    else:
        reason = f"the A/A interval holds 0 and is {width:.4f} wide, under {limit:.4f}"
    return Decision(interval.contains(0.0) and width < limit, reason, width, limit)
