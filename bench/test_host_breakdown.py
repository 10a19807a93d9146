"""bench/host_breakdown.py against runner_hooks as it is, on the CPU, so that it cannot rot.

The breakdown reaches into runner_hooks' internals.  Here every name it lists
must resolve, and every one of its steps is built and run once over a real
ResetPrefetcherByName whose CUDA-only pieces (events, the stream handle, the
capture check, the device) are stand-ins, so a rename or a new signature in
runner_hooks fails this test rather than the next GPU run.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from runner_hooks.core import prefetch as prefetch_module
from runner_hooks.hooks import ForwardHooks

from . import host_breakdown, variants
from .cpu_fakes import LayoutCheckingSsu, counting_clock
from .synthetic_model import DecodeModel, MixerShape
from .target import BenchUnavailable
from .variants import ResetPrefetcherByName

SMALL = MixerShape(nheads=4, head_dim=8, dstate=16, ngroups=2, hidden=64)
LAYERS = 3


def resolve(dotted: str) -> object:
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(dotted)


@pytest.mark.parametrize("name", host_breakdown.RUNNER_HOOKS_NAMES)
def test_every_runner_hooks_name_it_uses_exists(name):
    resolve(name)


class FakeEvent:
    """torch.Event where a CPU-only torch has none; the CPU plan records none anyway."""

    def record(self, stream=None) -> None:
        pass


@pytest.fixture
def cpu_breakdown(monkeypatch):
    """The breakdown's parts on the CPU: a real ResetPrefetcherByName over a real SeedPrefetch."""

    def cpu_seed_prefetch(owner, num_ssu_calls, device, make_drawer):
        return prefetch_module.SeedPrefetch(
            type(owner).__name__, num_ssu_calls, torch.device("cpu"), make_drawer().draw
        )

    monkeypatch.setattr(variants, "_reset_prefetch", cpu_seed_prefetch)
    monkeypatch.setattr(variants, "cuda_device", lambda device, n: torch.device("cpu"))
    monkeypatch.setattr(torch, "Event", FakeEvent)
    monkeypatch.setattr(prefetch_module, "_current_stream_handle", lambda index: 0)
    monkeypatch.setattr(prefetch_module, "_is_capturing", lambda: False)
    # One stream on the CPU: never a handover.
    monkeypatch.setattr(prefetch_module.SeedPrefetch, "_hand_over", lambda self: None)
    ssu = LayoutCheckingSsu()
    model = DecodeModel(
        SMALL, num_layers=LAYERS, batch_size=1, gemms=False, device=torch.device("cpu"), ssu=ssu
    )
    hooks = ForwardHooks()
    prefetcher = ResetPrefetcherByName(LAYERS, "cpu", drawer="randint")
    hooks.register(prefetcher)
    base = torch.zeros(1, dtype=torch.int64)
    return host_breakdown.Breakdown(model, hooks, prefetcher, base), ssu


def test_every_step_runs_against_todays_runner_hooks(cpu_breakdown):
    parts, ssu = cpu_breakdown
    steps = host_breakdown.breakdown_steps(parts)
    assert list(steps) == [name for name, _ in host_breakdown.STEPS]
    for name, step in steps.items():
        ssu.seeds.clear()
        step()
        assert len(ssu.seeds) == LAYERS, name
        if name == "design":
            # The design's seeds are the prefetched ones, all of them consumed.
            assert ssu.seeds == parts.prefetcher.prefetch._buffer.whole.tolist(), name
        if name in ("floor", "floor_rng", "capture_check", "stream_check", "draw"):
            assert ssu.seeds == [0] * LAYERS, name
    assert parts.hooks.current is None


def test_measure_and_table_on_a_made_up_clock(cpu_breakdown):
    parts, _ = cpu_breakdown
    steps = host_breakdown.breakdown_steps(parts)
    samples = host_breakdown.measure(steps, rounds=12, seed=0, timer=counting_clock)
    assert {name: len(values) for name, values in samples.items()} == dict.fromkeys(steps, 12)
    lines = host_breakdown.table(samples, resamples=50)
    assert len(lines) == 2 + len(steps)
    assert lines[2].startswith("| floor (fixed seed) | 100.0 [100.0, 100.0] | 0.0 |")
    assert lines[-1].endswith("| +0.0 [+0.0, +0.0] | 1.000 |")


def test_main_says_why_it_cannot_run(monkeypatch, capsys):
    def unavailable():
        raise BenchUnavailable("CUDA is not available")

    monkeypatch.setattr(host_breakdown, "flashinfer_target", unavailable)
    assert host_breakdown.main(["--rounds", "3"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
