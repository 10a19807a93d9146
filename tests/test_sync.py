"""Sync plans: which seeds get an event, for every plan and batch size."""

from __future__ import annotations

import pytest

from bench.sync import SYNC_PLANS, SyncPlan, resolve_sync_plan


def test_per_seed_has_one_segment_per_seed() -> None:
    assert SYNC_PLANS["per_seed"].segments(3) == ((0, 1), (1, 2), (2, 3))


def test_geometric_events_follow_seeds_0_1_3_7_and_the_last() -> None:
    plan = SYNC_PLANS["geometric"]
    assert plan.event_after(40) == (0, 1, 3, 7, 15, 31, 39)
    assert plan.event_after(32) == (0, 1, 3, 7, 15, 31)
    assert plan.event_after(1) == (0,)
    assert plan.segments(8) == ((0, 1), (1, 2), (2, 4), (4, 8))


def test_single_has_one_segment() -> None:
    assert SYNC_PLANS["single"].segments(40) == ((0, 40),)


@pytest.mark.parametrize("name", sorted(SYNC_PLANS))
@pytest.mark.parametrize("num_seeds", [1, 2, 5, 40, 64])
def test_segments_cover_every_seed_once_in_order(name: str, num_seeds: int) -> None:
    segments = SYNC_PLANS[name].segments(num_seeds)
    covered = [k for start, stop in segments for k in range(start, stop)]
    assert covered == list(range(num_seeds))


def test_resolve_by_name_and_by_object() -> None:
    plan = SyncPlan("custom", lambda n: (n - 1,))
    assert resolve_sync_plan(plan) is plan
    assert resolve_sync_plan("geometric") is SYNC_PLANS["geometric"]
    with pytest.raises(ValueError, match="unknown sync plan 'nope'"):
        resolve_sync_plan("nope")


def test_bad_plans_and_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one seed"):
        SYNC_PLANS["single"].segments(0)
    with pytest.raises(ValueError, match="gave"):
        SyncPlan("short", lambda n: (n - 2,)).segments(4)
    with pytest.raises(ValueError, match="gave"):
        SyncPlan("unsorted", lambda n: (2, 1, n - 1)).segments(4)
