"""Where consumers wait: the sync plans the bench compares, by name.

Each cross-stream wait costs about as much as the tiny kernel it hides (about
1.4 µs under a CUDA graph on an H200), so one event per seed gives back little
of the removed RNG cost.  The k-th SSU call comes after k-1 others, so the side
stream is usually far ahead of the consumers: seed k needs only *some* event
recorded after it.  Seed k is covered by the first event at an index >= k, and
each event is waited on once, by the first consumer it covers.
"""

from __future__ import annotations

from runner_hooks.forward_context.side_stream import PER_SEED, SyncPlan


def _geometric(num_seeds: int) -> tuple[int, ...]:
    ends = []
    k = 0
    while k < num_seeds - 1:
        ends.append(k)
        k = 2 * k + 1
    return (*ends, num_seeds - 1)


def _last_only(num_seeds: int) -> tuple[int, ...]:
    return (num_seeds - 1,)


GEOMETRIC = SyncPlan("geometric", _geometric)
"""Events after seeds 0, 1, 3, 7, ..., N-1: about log2(N) waits per forward,
and the early consumers, which the side stream is least ahead of, wait for few
seeds."""
SINGLE = SyncPlan("single", _last_only)
"""One event after all N seeds: one wait per forward, at its first SSU call."""

SYNC_PLANS: dict[str, SyncPlan] = {plan.name: plan for plan in (PER_SEED, GEOMETRIC, SINGLE)}


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
