"""The reset design draws no seed inside any CUDA graph: each forward's seeds are drawn
as it begins, before a FULL graph's capture and before each replay alike, into the one
buffer its graphs read. That it gives stock's seeds and leaves the generator where
stock does, eagerly and over graphs captured as V1 and V2 capture them and replayed:
test_prefetch_identity.py. Here: no graph it captures draws, and the controls show the
identity tests fail without the generator's rewind after a capture the forward
encloses (V1) and without the draw before a replay."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from runner_hooks.core import prefetch as prefetch_module

from .harness import CAPTURE_STYLES, Runner, assert_same_seeds, run_both
from .test_prefetch_identity import captured_then_replayed

pytestmark = pytest.mark.gpu

capture_styles = pytest.mark.parametrize("style", CAPTURE_STYLES)


@pytest.fixture
def make_reset(drawer: str) -> Callable[..., Runner]:
    """`make_reset(None)` is stock, `make_reset("design")` the reset design."""

    def make(which: str | None, batch_size: int = 1) -> Runner:
        return Runner("reset" if which else None, drawer=drawer, batch_size=batch_size)

    return make


def a_replay_moves_the_generator(runner: Runner, style: str) -> bool:
    """Whether a replay with no forward and no draw before it moves the generator."""
    runner.decode()
    captured = runner.capture(runner.new_record(), style)
    torch.cuda.synchronize()
    before = torch.cuda.get_rng_state()
    captured.graph.replay()
    torch.cuda.synchronize()
    return not torch.equal(before, torch.cuda.get_rng_state())


@capture_styles
def test_no_graph_draws(make_reset, style: str) -> None:
    assert not a_replay_moves_the_generator(make_reset("design"), style)


def test_the_no_draw_test_catches_a_graph_that_draws() -> None:
    """The control: stock's graph draws, so its replay moves the generator."""
    assert a_replay_moves_the_generator(Runner(None), "v1")


def test_the_capture_test_fails_without_the_rewind(
    make_reset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: with the forward opened before the capture (V1), its draws as it
    began must be taken back as it ends; without that, the generator ends 4N
    offsets past stock's."""
    monkeypatch.setattr(prefetch_module.SeedPrefetch, "_rewind", lambda self, offsets: None)
    with pytest.raises(AssertionError, match="the generator ends where stock leaves it"):
        run_both(captured_then_replayed("v1"), make_reset)


@capture_styles
def test_the_replay_test_fails_without_the_draw_before_a_replay(make_reset, style: str) -> None:
    """The control: replayed with no draw before it (no forward around it, no
    `replay(key)`), the graph reads the seeds last drawn, and the generator stays."""

    def script(runner: Runner) -> list[torch.Tensor]:
        records = [runner.decode()]
        captured = runner.capture(runner.new_record(), style)
        for _ in range(3):
            if runner.prefetcher is None:
                records.append(runner.replay(captured))
            else:
                captured.graph.replay()  # nothing drawn for this replay
                records.append(captured.record.clone())
        return records

    with pytest.raises(AssertionError, match=r"generator ends where stock|record"):
        assert_same_seeds(*run_both(script, make_reset))
