"""Where consumers wait: which seeds of a batch get an event after them.

Each cross-stream wait costs about as much as the tiny kernel it hides (about
1.4 us under a CUDA graph on an H200, REFERENCE.md), so one event per seed
gives back little of the removed RNG cost.  The k-th SSU call of a forward
comes after k-1 others, so the side stream is usually far ahead of the
consumers: seed k needs only *some* event recorded after it.  A plan lists the
seeds after which an event is recorded; seed k is covered by the first event
at an index >= k, and each event is waited on once, by the first consumer it
covers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SyncPlan:
    """How a batch of seeds is published to its consumers.

    name: how users pick it.
    event_after: for N seeds, the ascending seed indices after which an event
        is recorded; the last is N - 1, so every seed is covered.
    side_stream: draw on the side stream and publish through those events;
        when False the seeds are drawn on the consumers' own stream as the
        forward begins, which needs no event and no wait at all.
    """

    name: str
    event_after: Callable[[int], tuple[int, ...]]
    side_stream: bool = True

    def segments(self, num_seeds: int) -> tuple[tuple[int, int], ...]:
        """The [start, stop) seed ranges that end at an event, in order."""
        if num_seeds < 1:
            raise ValueError(f"a seed batch holds at least one seed, got {num_seeds}")
        ends = self.event_after(num_seeds)
        if not ends or ends[-1] != num_seeds - 1 or list(ends) != sorted(set(ends)):
            raise ValueError(
                f"sync plan {self.name!r} gave {ends} for {num_seeds} seeds"
            )
        starts = (0, *(end + 1 for end in ends[:-1]))
        return tuple((start, end + 1) for start, end in zip(starts, ends, strict=True))


def _geometric(num_seeds: int) -> tuple[int, ...]:
    ends = []
    k = 0
    while k < num_seeds - 1:
        ends.append(k)
        k = 2 * k + 1
    return (*ends, num_seeds - 1)


def _last_only(num_seeds: int) -> tuple[int, ...]:
    return (num_seeds - 1,)


PER_SEED = SyncPlan("per_seed", lambda n: tuple(range(n)))
"""One event per seed: the seed document's design."""
GEOMETRIC = SyncPlan("geometric", _geometric)
"""Events after seeds 0, 1, 3, 7, ..., N-1: about log2(N) waits per forward,
and the early consumers, which the side stream is least ahead of, wait for few
seeds."""
SINGLE = SyncPlan("single", _last_only)
"""One event after all N seeds: one wait per forward, at its first SSU call."""
CURRENT_STREAM = SyncPlan("current_stream", _last_only, side_stream=False)
"""No side stream: all N seeds drawn on the forward's own stream as it begins."""

SYNC_PLANS: dict[str, SyncPlan] = {
    plan.name: plan for plan in (PER_SEED, GEOMETRIC, SINGLE, CURRENT_STREAM)
}


def resolve_sync_plan(plan: str | SyncPlan) -> SyncPlan:
    """The plan itself, or the one registered under that name."""
    if isinstance(plan, SyncPlan):
        return plan
    try:
        return SYNC_PLANS[plan]
    except KeyError:
        raise ValueError(
            f"unknown sync plan {plan!r}; choose one of {sorted(SYNC_PLANS)}"
        ) from None
