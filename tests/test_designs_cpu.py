"""When each design schedules, hands out and closes seed batches (no CUDA).

The CUDA machinery (`SeedPrefetch`) is replaced by a recording stand-in, so
these tests pin down the designs' own logic: how a forward is delimited and
every case in which `next_seed()` must fall back to the inline stock draw.
The real machinery is tested against stock on the GPU (tests/gpu).
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass

import pytest
import torch

from bench import variants
from bench.variants import (
    ForwardContextPrefetcherByName,
    ResetPrefetcherByName,
)
from runner_hooks.forward_context import prefetcher as prefetch_module
from runner_hooks.hooks import ForwardHooks, ForwardInfo

N = 4


@dataclass(eq=False)
class FakeBatch:
    """Stands in for SeedBatch: seeds are (batch number, index) tuples."""

    number: int
    consumed: int = 0
    under_capture: bool | None = None

    def take(self) -> tuple[int, int] | None:
        if self.consumed >= N:
            return None
        self.consumed += 1
        return (self.number, self.consumed - 1)


class FakePrefetch:
    """Stands in for SeedPrefetch, recording what the design asks of it."""

    def __init__(self) -> None:
        self.scheduled: list[FakeBatch] = []
        self.finished: list[tuple[int, int]] = []
        self.full_cudagraph: list[bool] = []
        self.filled: list[int] = []

    def schedule(self) -> FakeBatch:
        batch = FakeBatch(len(self.scheduled))
        self.scheduled.append(batch)
        return batch

    def fill(self, count: int) -> None:
        self.filled.append(count)

    def finish(self, batch: FakeBatch, full_cudagraph: bool = False) -> None:
        self.finished.append((batch.number, batch.consumed))
        self.full_cudagraph.append(full_cudagraph)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakePrefetch:
    prefetch = FakePrefetch()
    for name in ("_reset_prefetch", "_side_stream_prefetch"):
        monkeypatch.setattr(variants, name, lambda *args: prefetch)
    for module in (variants, prefetch_module):
        monkeypatch.setattr(module, "cuda_device", lambda device, n: torch.device("cuda", 0))
    return prefetch


def reset_design(fake: FakePrefetch) -> tuple[ForwardHooks, ResetPrefetcherByName]:
    hooks = ForwardHooks()
    prefetcher = ResetPrefetcherByName(N, "cuda")
    hooks.register(prefetcher)
    return hooks, prefetcher


def test_reset_schedules_as_a_decode_forward_begins(fake: FakePrefetch) -> None:
    hooks, prefetcher = reset_design(fake)
    with hooks.forward(ForwardInfo(runs_ssu=True)):
        assert len(fake.scheduled) == 1
        seeds = [prefetcher.next_seed() for _ in range(N + 2)]
    assert seeds == [(0, 0), (0, 1), (0, 2), (0, 3), None, None]
    assert fake.finished == [(0, N + 0)]


def test_reset_falls_back_outside_a_forward(fake: FakePrefetch) -> None:
    hooks, prefetcher = reset_design(fake)
    assert prefetcher.next_seed() is None
    with hooks.forward(ForwardInfo(runs_ssu=True)):
        prefetcher.next_seed()
    assert prefetcher.next_seed() is None
    assert len(fake.scheduled) == 1


@pytest.mark.parametrize(
    "info",
    [ForwardInfo(runs_ssu=False), ForwardInfo(runs_ssu=True, micro_batched=True)],
    ids=["prefill_only", "micro_batched"],
)
def test_reset_draws_nothing_for_forwards_that_fall_back(
    fake: FakePrefetch, info: ForwardInfo
) -> None:
    hooks, prefetcher = reset_design(fake)
    with hooks.forward(info):
        assert [prefetcher.next_seed() for _ in range(N)] == [None] * N
    assert fake.scheduled == [] and fake.finished == []


def test_reset_draws_full_cudagraph_forwards_as_they_begin(fake: FakePrefetch) -> None:
    """Before a FULL graph's capture and replay alike, so the graph itself draws
    nothing; the end tells the prefetch the forward was one (a replay takes none)."""
    hooks, prefetcher = reset_design(fake)
    info = ForwardInfo(runs_ssu=True, full_cudagraph=True)
    with hooks.forward(info):  # a replay: no SSU call
        assert len(fake.scheduled) == 1
    with hooks.forward(info):  # a capture
        assert len(fake.scheduled) == 2
        assert prefetcher.next_seed() == (1, 0)
    assert fake.finished == [(0, 0), (1, 1)]
    assert fake.full_cudagraph == [True, True]


def test_reset_replays_draw_what_their_graph_captured(fake: FakePrefetch) -> None:
    """V2: a FULL graph's replay, with no forward around it, draws the seeds its
    capture took; a graph captured outside a forward, or a key not captured, none."""
    prefetcher = ResetPrefetcherByName(N, "cuda")
    with prefetcher.forward(captures="graph a"):
        fake.scheduled[-1].under_capture = True
        prefetcher.next_seed()
        prefetcher.next_seed()
    with prefetcher.forward(captures="warm-up of b"):  # not inside a capture
        fake.scheduled[-1].under_capture = False
        prefetcher.next_seed()
    for graph in ("graph a", "warm-up of b", "never captured"):
        prefetcher.replay(graph)
    assert fake.filled == [2]


def test_reset_closes_the_batch_also_when_the_forward_raises(fake: FakePrefetch) -> None:
    hooks, prefetcher = reset_design(fake)
    with pytest.raises(RuntimeError, match="model"), hooks.forward(ForwardInfo(runs_ssu=True)):
        prefetcher.next_seed()
        raise RuntimeError("model failed")
    assert fake.finished == [(0, 1)]
    assert prefetcher.next_seed() is None


def test_reset_each_forward_gets_its_own_batch(fake: FakePrefetch) -> None:
    hooks, prefetcher = reset_design(fake)
    for number in range(3):
        with hooks.forward(ForwardInfo(runs_ssu=True)):
            assert prefetcher.next_seed() == (number, 0)
    assert [batch.number for batch in fake.scheduled] == [0, 1, 2]


def test_reset_a_micro_batched_forward_may_run_outside_the_hooks(
    monkeypatch: pytest.MonkeyPatch, fake: FakePrefetch
) -> None:
    """Why V2's DBO capture stays outside the hooks: around eager forwards, inside
    them or not, the prefetcher draws and hands out the same."""
    info = ForwardInfo(runs_ssu=True, micro_batched=True)

    def run(hooked: bool) -> tuple[list[object], list[tuple[int, int]]]:
        fake = FakePrefetch()  # a fresh one per run, in place of the fixture's
        monkeypatch.setattr(variants, "_reset_prefetch", lambda *args: fake)
        hooks, prefetcher = reset_design(fake)
        seeds: list[object] = []
        for forward in (ForwardInfo(runs_ssu=True), info, ForwardInfo(runs_ssu=True)):
            tested = forward is info
            with hooks.forward(forward) if hooked or not tested else contextlib.nullcontext():
                seeds += [prefetcher.next_seed() for _ in range(N if tested else 2)]
        return seeds, fake.finished

    assert run(hooked=True) == run(hooked=False)


class Forward:
    """Stands in for vLLM's ForwardContext."""

    def __init__(self, micro_batched: bool = False) -> None:
        self.micro_batched = micro_batched


def forward_context(
    fake: FakePrefetch,
) -> tuple[list[Forward | None], ForwardContextPrefetcherByName]:
    current: list[Forward | None] = [None]
    prefetcher = ForwardContextPrefetcherByName(
        N,
        "cuda",
        lambda: current[0],
        is_micro_batched=lambda forward: forward.micro_batched,  # type: ignore[attr-defined]
    )
    return current, prefetcher


def test_forward_context_draws_at_the_first_seed_of_a_new_forward(fake: FakePrefetch) -> None:
    current, prefetcher = forward_context(fake)
    current[0] = Forward()
    assert fake.scheduled == []
    assert [prefetcher.next_seed() for _ in range(N + 1)] == [(0, k) for k in range(N)] + [None]
    current[0] = Forward()
    assert prefetcher.next_seed() == (1, 0)
    assert fake.finished == [(0, N)]


def test_forward_context_falls_back_outside_a_forward_and_for_micro_batches(
    fake: FakePrefetch,
) -> None:
    current, prefetcher = forward_context(fake)
    assert prefetcher.next_seed() is None
    current[0] = Forward(micro_batched=True)
    assert prefetcher.next_seed() is None
    assert fake.scheduled == []
    current[0] = None
    assert prefetcher.next_seed() is None


def test_forward_context_tells_a_new_forward_from_a_dead_one_at_the_same_address(
    fake: FakePrefetch,
) -> None:
    current, prefetcher = forward_context(fake)
    for _ in range(5):
        current[0] = Forward()
        prefetcher.next_seed()
        current[0] = None
        gc.collect()  # the next Forward may well reuse the freed address
    assert len(fake.scheduled) == 5
    assert fake.finished == [(number, 1) for number in range(4)]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_without_cuda_both_designs_disable_gracefully(device: str) -> None:
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here; this checks the no-CUDA path")
    hooks = ForwardHooks()
    reset = ResetPrefetcherByName(N, device)
    hooks.register(reset)
    base = ForwardContextPrefetcherByName(N, device, lambda: Forward())
    assert reset.prefetch is None and reset.inactive_reason == prefetch_module.NO_CUDA
    assert base.prefetch is None and base.inactive_reason == prefetch_module.NO_CUDA
    with hooks.forward(ForwardInfo(runs_ssu=True)):
        assert reset.next_seed() is None
        assert base.next_seed() is None


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "40"])
def test_num_ssu_calls_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError, match="num_ssu_calls"):
        ResetPrefetcherByName(bad, "cpu")  # type: ignore[arg-type]


def test_unknown_plan_or_drawer_names_are_refused_even_when_disabled() -> None:
    with pytest.raises(ValueError, match="unknown sync plan"):
        ForwardContextPrefetcherByName(N, "cpu", lambda: None, sync_plan="fastest")
    with pytest.raises(ValueError, match="unknown seed drawer"):
        ResetPrefetcherByName(N, "cpu", drawer="magic")


@pytest.fixture
def drawn_by(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A CUDA device as far as the prefetchers look; returns the name of the drawer
    each reset prefetcher built draws with."""
    made: list[str] = []

    def record(owner, n, device, draw, *rest):
        drawer = getattr(draw, "__self__", None)  # a bound method's drawer, else a function
        made.append(drawer.name if drawer is not None else draw.__name__)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(variants, "SeedPrefetch", record)
    return made


def test_auto_is_the_triton_draw(drawn_by: list[str]) -> None:
    """The library's "auto": the one Triton launch outside every graph."""
    ResetPrefetcherByName(N, torch.device("cuda", 0))
    assert drawn_by == ["fill_randint_seeds"]


def test_a_named_randint_drawer_still_prefetches(drawn_by: list[str]) -> None:
    ResetPrefetcherByName(N, torch.device("cuda", 0), drawer="randint")
    assert drawn_by == ["randint"]


def test_without_cuda_the_reason_is_given() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here; this checks the no-CUDA path")
    assert ResetPrefetcherByName(N, "cuda").inactive_reason == prefetch_module.NO_CUDA
