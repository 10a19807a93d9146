"""bench/checked_once.py on the CPU, CUDA faked: each eager guarantee holds with the
checks once per forward, and each guarantee's test FAILS with its check removed
(the mutations below), so the checks that remain are the ones that keep them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from bench import checked_once
from bench.test_outside_graph import FakeGenerator, cuda  # noqa: F401
from runner_hooks import WrongStreamError

N = 4


def prefetcher(generator: FakeGenerator) -> checked_once.CheckedOncePrefetcher:
    return checked_once.checked_once_prefetcher(N, torch.device("cpu"), generator.draw)


def reads_its_own_seeds(cuda) -> None:  # noqa: F811
    """Every forward reads seeds drawn for it: fresh each forward, none another's."""
    generator = FakeGenerator()
    p = prefetcher(generator)
    seen = []
    for _ in range(3):
        with p.forward():
            seen.append([int(p.next_seed()) for _ in range(N)])  # type: ignore[arg-type]
    assert seen == [[0, 4, 8, 12], [16, 20, 24, 28], [32, 36, 40, 44]], seen


def no_stale_seed_in_a_graph(cuda) -> None:  # noqa: F811
    """Seeds drawn eagerly are not handed to a capture (its replays would read them
    stale): at the first seed, and where the forward enters a capture later."""
    p = prefetcher(FakeGenerator())
    with p.forward():
        cuda.capturing = True
        first = p.next_seed()
        cuda.capturing = False
    assert first is None, "a capture got a seed drawn outside it"
    with p.forward():
        taken = [p.next_seed() for _ in range(N - 1)]
        cuda.capturing = True
        last = p.next_seed()
        cuda.capturing = False
    assert None not in taken and last is None, "a capture got a seed drawn outside it"


def wrong_stream_caught(cuda) -> None:  # noqa: F811
    """A consumer on another stream than its forward's: at the first seed, and a
    forward that moved to another stream after it."""
    p = prefetcher(FakeGenerator())
    for moved_after in (0, 1):
        cuda.stream = 1
        with p.forward():
            for _ in range(moved_after):
                p.next_seed()
            cuda.stream = 2
            with pytest.raises(WrongStreamError, match="must run on the stream"):
                for _ in range(N):
                    p.next_seed()
    cuda.stream = 1


GUARANTEES: list[Callable[..., None]] = [
    reads_its_own_seeds,
    no_stale_seed_in_a_graph,
    wrong_stream_caught,
]


@pytest.mark.parametrize("guarantee", GUARANTEES, ids=lambda g: g.__name__)
def test_each_guarantee_holds(cuda, guarantee) -> None:  # noqa: F811
    guarantee(cuda)


def test_the_checks_run_once_per_forward_not_per_call(
    cuda,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    check = checked_once.CheckedOnceBatch._checked

    def counted(self, k: int) -> bool:
        calls.append(k)
        return check(self, k)

    monkeypatch.setattr(checked_once.CheckedOnceBatch, "_checked", counted)
    p = checked_once.checked_once_prefetcher(40, torch.device("cpu"), FakeGenerator().draw)
    with p.forward():
        for _ in range(40):
            p.next_seed()
    assert calls == [0, 39]


def unchecked(self, k: int) -> bool:
    return True


def stream_only(self, k: int) -> bool:
    """The check with its capture half removed."""
    from runner_hooks.core import prefetch as core

    if core._current_stream_handle(self._device_index) != self._stream_handle:
        raise WrongStreamError("must run on the stream")
    return True


def capture_only(self, k: int) -> bool:
    """The check with its stream half removed."""
    from runner_hooks.core import prefetch as core

    return core._is_capturing() == self.under_capture


@pytest.mark.parametrize(
    ("mutation", "guarantee"),
    [
        (unchecked, no_stale_seed_in_a_graph),
        (unchecked, wrong_stream_caught),
        (stream_only, no_stale_seed_in_a_graph),
        (capture_only, wrong_stream_caught),
    ],
    ids=lambda item: item.__name__,
)
def test_each_guarantees_test_fails_without_its_check(
    cuda,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    mutation,
    guarantee,
) -> None:
    monkeypatch.setattr(checked_once.CheckedOnceBatch, "_checked", mutation)
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        guarantee(cuda)


@pytest.mark.parametrize("guarantee", [no_stale_seed_in_a_graph, wrong_stream_caught])
def test_each_guarantees_test_fails_without_the_check_at_the_last_seed(
    cuda,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    guarantee,
) -> None:
    """Checked at the first seed alone, a forward that enters a capture or moves to
    another stream after it goes unnoticed."""
    check = checked_once.CheckedOnceBatch._checked
    monkeypatch.setattr(
        checked_once.CheckedOnceBatch, "_checked", lambda self, k: k != 0 or check(self, k)
    )
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        guarantee(cuda)
