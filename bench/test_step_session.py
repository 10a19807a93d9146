"""The whole bench flow on the CPU: build, seed check, skip/fail handling, timing, summary.

CUDA-only pieces are swapped for the stand-ins of cpu_fakes.py: graphs replay
eagerly and the clock is made up.  The prefetchers are the real ones; on a CPU
device they are disabled and fall back to stock's inline draw, so every real
variant must pass the seed check here, and the planted wrong one must not.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from . import seedcheck, step_session
from .cpu_fakes import LayoutCheckingSsu, capture_eagerly, counting_clock, cpu_target
from .options import BenchOptions
from .stats import MIN_SAMPLES
from .step_session import BenchSession
from .summary import FAILED, MODES, OK, SKIPPED, summarize, write_summary
from .synthetic_model import MixerShape
from .target import BenchUnavailable
from .variants import SEED_HIGH, StockSource, VariantSpec, variant_specs

SMALL = MixerShape(nheads=4, head_dim=8, dstate=16, ngroups=2, hidden=64)


class OffByOneSource(StockSource):
    """Fast and wrong: every seed one more than stock's."""

    def seed(self) -> torch.Tensor:
        return super().seed() + 1


def _unbuildable(layers: int, device: torch.device):
    raise ImportError("no module named 'imaginary_drawer'")


def _broken(layers: int, device: torch.device):
    raise ValueError("bad argument")


@pytest.fixture
def cpu_flow(monkeypatch):
    monkeypatch.setattr(step_session, "capture_step", capture_eagerly)
    monkeypatch.setattr(seedcheck, "capture_step", capture_eagerly)
    monkeypatch.setattr(step_session, "device_us_per_step", counting_clock)
    monkeypatch.setattr(step_session, "host_us_per_step", counting_clock)


def make_session(specs, tmp_path, batch_sizes=(1, 2), rounds=2, seed=0) -> BenchSession:
    options = BenchOptions(
        layers=3, batch_sizes=batch_sizes, rounds=rounds, seed=seed, out_dir=tmp_path
    )
    ssu = LayoutCheckingSsu()
    return BenchSession(options, shape=SMALL, specs=specs, locate=lambda: cpu_target(ssu))


def test_every_real_variant_passes_and_is_timed(cpu_flow, tmp_path):
    bench = make_session(variant_specs(), tmp_path)
    for batch_size in (1, 2):
        run = bench.batch(batch_size)
        assert {cell.status for cell in run.cells.values()} == {OK}
        assert all(len(cell.step_us) == 2 for cell in run.cells.values())
    cells = bench.cells()
    assert len(cells) == len(bench.specs) * len(MODES) * 2
    assert len(bench.cases()) == len(cells)
    assert not bench.notes


def test_wrong_unbuildable_and_broken_variants_are_reported(cpu_flow, tmp_path):
    specs = variant_specs()
    stock, floor = specs[0], specs[-1]
    bench = make_session(
        [
            stock,
            VariantSpec("off-by-one", lambda layers, device: OffByOneSource(device)),
            VariantSpec("unbuildable", _unbuildable),
            VariantSpec("broken", _broken),
            floor,
        ],
        tmp_path,
    )
    for batch_size in (1, 2):
        cells = bench.batch(batch_size).cells
        for mode in MODES:
            assert cells["stock", mode].status == OK
            assert cells["floor", mode].status == OK
            wrong = cells["off-by-one", mode]
            assert wrong.status == FAILED
            assert "seed check, BS1 eager" in wrong.reason and "differ from stock" in wrong.reason
            assert cells["unbuildable", mode].status == SKIPPED
            assert "imaginary_drawer" in cells["unbuildable", mode].reason
            assert cells["broken", mode].status == FAILED
            assert "bad argument" in cells["broken", mode].reason

    rows = summarize(bench.cells())
    json_path, md_path = write_summary(rows, bench.run_info("pytest bench"), tmp_path)
    assert json_path.name.startswith("cpu-test-device-")
    written = json.loads(json_path.read_text())
    assert {row["status"] for row in written} == {OK, SKIPPED, FAILED}
    assert "**FAILED**" in md_path.read_text()


def test_seed_check_sees_a_seed_that_comes_late(cpu_flow, tmp_path):
    """A variant right on the first step but wrong on later ones is caught."""

    class StaleSource(StockSource):
        def __init__(self, device):
            super().__init__(device)
            self.first = None

        def seed(self):
            if self.first is None:
                self.first = torch.randint(0, SEED_HIGH, (1,))
            return self.first

    specs = variant_specs()
    bench = make_session(
        [specs[0], VariantSpec("stale", lambda layers, device: StaleSource(device)), specs[-1]],
        tmp_path,
        batch_sizes=(1,),
    )
    assert bench.batch(1).cells["stale", "eager"].status == FAILED


def test_unavailable_target_is_remembered(tmp_path):
    calls = []

    def locate():
        calls.append(1)
        raise BenchUnavailable("no GPU here")

    bench = BenchSession(BenchOptions(out_dir=tmp_path), locate=locate)
    for _ in range(2):
        with pytest.raises(BenchUnavailable, match="no GPU here"):
            bench.target()
    assert calls == [1]
    assert bench.cells() == []


def test_an_error_at_one_batch_size_is_raised_again_not_retried(cpu_flow, tmp_path):
    attempts = []

    def failing_stock(layers, device):
        attempts.append(1)
        raise RuntimeError("stock cannot be built")

    specs = variant_specs()
    bench = make_session([VariantSpec("stock", failing_stock), specs[-1]], tmp_path)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="stock"):
            bench.batch(1)
    assert attempts == [1]


def test_terminal_summary_prints_and_writes_the_files(cpu_flow, tmp_path):
    from . import conftest

    bench = make_session(variant_specs(), tmp_path, batch_sizes=(1,))
    bench.batch(1)
    written: list[str] = []

    class Reporter:
        def write_sep(self, sep: str, title: str) -> None:
            written.append(title)

        def write(self, text: str) -> None:
            written.append(text)

        def write_line(self, line: str) -> None:
            written.append(line)

    config = SimpleNamespace(
        stash={conftest.SESSION: bench},
        invocation_params=SimpleNamespace(args=("bench", "--benchmark-only", "-k", "bs1 and x")),
    )
    conftest.pytest_terminal_summary(Reporter(), 0, config)
    text = "\n".join(written)
    assert "Command: `pytest bench --benchmark-only -k 'bs1 and x'`" in text
    stems = sorted(path.name for path in tmp_path.iterdir())
    assert len(stems) == 2 and stems[0].endswith(".md") and stems[1].endswith(".summary.json")
    assert f"written: {tmp_path / stems[1]}" in text


def test_round_orders_come_from_the_seed_per_batch_size_and_pass(cpu_flow, tmp_path, monkeypatch):
    real = step_session.interleaved
    draws: list[tuple[int, float]] = []

    def spy(steps, *, rng, **kwargs):
        draws.append((len(draws), rng.getstate()[1][:4]))
        return real(steps, rng=rng, **kwargs)

    monkeypatch.setattr(step_session, "interleaved", spy)

    def states(seed: int) -> list:
        draws.clear()
        specs = variant_specs()
        make_session([specs[0], specs[-1]], tmp_path, seed=seed).batch(1)
        make_session([specs[0], specs[-1]], tmp_path, batch_sizes=(2,), seed=seed).batch(2)
        return [state for _, state in draws]

    first = states(7)
    assert len(first) == 6 and len(set(first)) == 6  # eager, graph, host at BS1 and BS2
    assert states(7) == first
    assert states(8) != first


def test_rows_carry_intervals_and_run_info_records_the_seed(cpu_flow, tmp_path):
    specs = variant_specs()
    bench = make_session(
        [specs[0], specs[1], specs[-1]], tmp_path, batch_sizes=(1,), rounds=MIN_SAMPLES, seed=7
    )
    bench.batch(1)
    rows = bench.rows()
    assert rows == summarize(bench.cells())
    assert all(row.median_ci95_us == (100.0, 100.0) for row in rows)  # the made-up clock
    stock = next(row for row in rows if (row.variant, row.mode) == ("stock", "graph"))
    assert stock.ties == ("forward-context", "floor")
    settings = "\n".join(bench.run_info("pytest bench").settings)
    assert "shuffled afresh per round by random.Random seeded from --bench-seed 7" in settings
    assert "percentile bootstrap, 2000 resamples" in settings
