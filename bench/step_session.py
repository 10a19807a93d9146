"""The bench run: builds, checks and times every variant once per batch size, for all tests.

The pytest-benchmark tests (test_step_time.py) each time one variant alone;
this session's interleaved pass times all of them round after round
(step_timing.py says why), and those samples make the summary.  Both run on the
same models, seed sources and graphs, built here once per batch size, when
the first test of that size asks.

Per batch size, in this order:
1. the model (synthetic_model.py) and, once per session, every variant's seed source
   (one source per variant for all sizes, as vLLM keeps one backend for all
   its graphs); a variant that cannot be built here (a drawer that does not
   compile) is SKIPPED with the reason;
2. the seed check (seedcheck.py): stock's records first, then each variant's,
   eager and graph; a variant whose seeds differ, or that raises, is FAILED
   in both modes at this and every later size, since its prefetcher's state
   after a failure is not to be trusted;
3. one captured graph per variant, for timing;
4. the interleaved passes: eager device time, graph replays, eager host time,
   each in rounds of every variant, in an order shuffled afresh each round
   from a generator seeded by --bench-seed, the batch size and the pass.
"""

from __future__ import annotations

import random
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import torch

from .graphs import capture_step
from .options import BenchOptions
from .seedcheck import CHECK_STEPS, mismatch, record_eager, record_graph, stock_anomalies
from .stats import BOOTSTRAP_SEED, CONFIDENCE, MIN_SAMPLES, RESAMPLES, seeded_rng
from .step_timing import Step, device_us_per_step, gc_paused, host_us_per_step, interleaved
from .summary import FAILED, FLOOR, MODES, SKIPPED, STOCK, Cell, Row, RunInfo, summarize
from .synthetic_model import DecodeModel, MixerShape
from .target import BenchUnavailable, Target, flashinfer_target
from .variants import SeedSource, VariantSpec, run_step, unavailable_errors, variant_specs

EAGER_BURST = 5
"""Eager steps per sample: several ms of host-bound launches, far above event resolution."""
GRAPH_BURST = 20
"""Graph replays per sample: several ms of device time."""


class BenchWarning(UserWarning):
    """Something about the run that makes its checks prove less than they seem."""


@dataclass(frozen=True)
class Case:
    """One pytest-benchmark test: a variant in a mode at a batch size."""

    batch_size: int
    mode: str
    variant: str

    @property
    def id(self) -> str:
        return f"bs{self.batch_size}-{self.mode}-{self.variant}"

    @property
    def group(self) -> str:
        """pytest-benchmark compares the tests of a group: the variants of one mode and size."""
        return f"{self.mode}-bs{self.batch_size}"


def describe_error(exc: BaseException) -> str:
    """An exception as one line, with the place that raised it."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}{at}"


@dataclass
class BatchRun:
    """Everything measured at one batch size; kept for the tests that time it again."""

    batch_size: int
    model: DecodeModel
    sources: dict[str, SeedSource]
    """The variants that passed their checks here."""
    graphs: dict[str, torch.cuda.CUDAGraph]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    """(variant, mode) -> its cell, for every variant."""
    _rows: list[Row] | None = field(default=None, repr=False)

    def step(self, variant: str, mode: str) -> Step:
        """Enqueues one step of `variant` in `mode`: an eager forward, or a graph replay.

        A replay runs no Python of the forward, no forward scope either, as
        vLLM's V2 runner replays FULL graphs (`run_fullgraph`); the reset design's
        replay opens its forward and draws first (graphs.around_replay), as its
        runners do.
        """
        if mode == "graph":
            return self.graphs[variant].replay
        source = self.sources[variant]
        return lambda: run_step(self.model, source)

    def rows(self) -> list[Row]:
        """The summary's rows at this batch size, summarized once, on first use.

        The bootstrap takes a while, and every test of the size asks; the
        cells are final once the size is timed.  Each (mode, batch size) draws
        from its own generator, so these are the figures of the run's summary.
        """
        if self._rows is None:
            self._rows = summarize(self.cells.values())
        return self._rows

    def row(self, variant: str, mode: str) -> Row:
        """The summary's figures for `variant` in `mode` at this batch size."""
        (row,) = (row for row in self.rows() if (row.variant, row.mode) == (variant, mode))
        return row


class BenchSession:
    """One per pytest run.  Nothing touches a GPU before the first test asks for it.

    `locate` finds the SSU and device (FlashInfer on CUDA by default); `specs`
    are the variants (all of variants.py by default).  Both are parameters so
    that the CPU unit tests can run the whole flow with a stand-in SSU.
    """

    def __init__(
        self,
        options: BenchOptions,
        *,
        shape: MixerShape | None = None,
        specs: Sequence[VariantSpec] | None = None,
        locate: Callable[[], Target] = flashinfer_target,
    ) -> None:
        self.options = options
        self.shape = shape or MixerShape()
        self.specs = list(specs if specs is not None else variant_specs())
        self.notes: list[str] = []
        self._locate = locate
        self._target: Target | BenchUnavailable | None = None
        self._sources: dict[str, SeedSource] | None = None
        self._problems: dict[str, tuple[str, str]] = {}
        """variant -> (SKIPPED or FAILED, why); it holds for every later batch size."""
        self._runs: dict[int, BatchRun] = {}
        self._errors: dict[int, BaseException] = {}

    def cases(self) -> list[Case]:
        """Every test, batch size outermost: a size's tests follow the one that measures it."""
        return [
            Case(batch_size, mode, spec.name)
            for batch_size in self.options.batch_sizes
            for mode in MODES
            for spec in self.specs
        ]

    def target(self) -> Target:
        """Where the bench runs; raises BenchUnavailable (every time) where it cannot."""
        if self._target is None:
            try:
                self._target = self._locate()
            except BenchUnavailable as exc:
                self._target = exc
        if isinstance(self._target, BenchUnavailable):
            raise self._target
        return self._target

    def batch(self, batch_size: int) -> BatchRun:
        """The run at `batch_size`, measured on first use.

        A size that could not be measured raises in its first test with the
        full traceback, and in the others with a one-line pointer to it,
        rather than being measured again by each.
        """
        if batch_size in self._errors:
            first = self._errors[batch_size]
            raise RuntimeError(
                f"BS{batch_size} could not be measured (see its first test): "
                f"{describe_error(first)}"
            ) from first
        if batch_size not in self._runs:
            try:
                self._runs[batch_size] = self._measure(batch_size)
            except BaseException as exc:
                self._errors[batch_size] = exc
                raise
        return self._runs[batch_size]

    def cells(self) -> list[Cell]:
        """Every measured cell: batch sizes in the order run, then modes, then variants."""
        return [
            run.cells[spec.name, mode]
            for run in self._runs.values()
            for mode in MODES
            for spec in self.specs
        ]

    def rows(self) -> list[Row]:
        """The summary of every measured cell, in the order of `cells()`."""
        by_key = {
            (row.batch_size, row.mode, row.variant): row
            for run in self._runs.values()
            for row in run.rows()
        }
        return [by_key[cell.batch_size, cell.mode, cell.variant] for cell in self.cells()]

    def run_info(self, command: str) -> RunInfo:
        """The summary's header."""
        target = self.target()
        return RunInfo(
            gpu=target.gpu,
            date=datetime.now(timezone.utc).strftime("%Y%m%d"),
            command=command,
            settings=(
                target.platform,
                "variants: stock = randint before each SSU (vLLM 0.33.0); forward-context = "
                "ForwardContextSeedPrefetcher (the forward-context design, its defaults); "
                "reset-<drawer> = SRSeedPrefetcher behind ForwardHooks; "
                "floor = one fixed seed tensor, no draws; floor-rng = the floor plus one "
                "one-element draw per forward",
                self.shape.describe(),
                self.options.describe(),
                f"median of the interleaved rounds; a sample is the CUDA-event time of "
                f"{EAGER_BURST} back-to-back eager steps or {GRAPH_BURST} graph replays, per "
                "step; host µs is the wall time to enqueue one eager step onto an idle GPU",
                "each round times every variant once, in an order shuffled afresh per round "
                f"by random.Random seeded from --bench-seed {self.options.seed} "
                f"('{self.options.seed}:bs<N>:<pass>', pass eager, graph or host)",
                f"spread: IQR of the samples; {CONFIDENCE:.0%} CI of each median and of the "
                f"ratio and recovered shares: percentile bootstrap, {RESAMPLES} resamples of the "
                f"rounds paired across variants, seed {BOOTSTRAP_SEED} (none below "
                f"{MIN_SAMPLES} rounds); ties: 95% CIs of the medians overlap",
                "seed check passed by every measured variant but the floors: each layer's seed "
                f"equal to stock's over {CHECK_STEPS} eager steps and {CHECK_STEPS} graph "
                "replays from one generator state, the generator left where stock leaves it",
                *self.notes,
            ),
            tag=self.options.tag,
        )

    def _note(self, text: str) -> None:
        self.notes.append(text)
        warnings.warn(BenchWarning(text), stacklevel=2)

    def _build_sources(self, device: torch.device) -> dict[str, SeedSource]:
        sources = {}
        unavailable = unavailable_errors()
        for spec in self.specs:
            try:
                sources[spec.name] = spec.build(self.options.layers, device)
            except unavailable as exc:
                self._problems[spec.name] = (SKIPPED, f"not built here: {describe_error(exc)}")
            except Exception as exc:
                self._problems[spec.name] = (FAILED, f"raised when built: {describe_error(exc)}")
        return sources

    def _require_references(self) -> None:
        """Stock and the floor are what every figure is relative to: without them, stop."""
        for required in (STOCK, FLOOR):
            if required in self._problems:
                raise RuntimeError(f"the {required} variant: {self._problems[required][1]}")

    def _live(self) -> dict[str, SeedSource]:
        """The sources of the variants that have not been skipped or failed, in spec order."""
        assert self._sources is not None
        return {
            spec.name: self._sources[spec.name]
            for spec in self.specs
            if spec.name not in self._problems
        }

    def _measure(self, batch_size: int) -> BatchRun:
        target = self.target()
        if self._sources is None:
            self._sources = self._build_sources(target.device)
        self._require_references()
        model = DecodeModel(
            self.shape,
            num_layers=self.options.layers,
            batch_size=batch_size,
            gemms=self.options.gemms,
            device=target.device,
            ssu=target.ssu,
        )
        self._check_seeds(model, batch_size)
        graphs = {}
        for name, source in self._live().items():
            try:
                graphs[name] = capture_step(model, source)
            except Exception as exc:
                self._problems[name] = (FAILED, f"BS{batch_size} capture: {describe_error(exc)}")
        self._require_references()
        live = self._live()
        run = BatchRun(
            batch_size, model, live, {name: graphs[name] for name in live if name in graphs}
        )
        self._time(run)
        return run

    def _check_seeds(self, model: DecodeModel, batch_size: int) -> None:
        """Fails (in self._problems) every variant whose seeds are not stock's at this size."""
        live = self._live()
        recorders = {"eager": record_eager, "graph": record_graph}
        stock = {mode: record(model, live[STOCK]) for mode, record in recorders.items()}
        for anomaly in stock_anomalies(stock["eager"], stock["graph"]):
            self._note(f"seed check at BS{batch_size}: {anomaly}")
        checked = {spec.name for spec in self.specs if spec.seed_checked and spec.name != STOCK}
        for name, source in live.items():
            if name not in checked:
                continue
            for mode, record in recorders.items():
                try:
                    problem = mismatch(stock[mode], record(model, source))
                except Exception as exc:
                    problem = f"raised {describe_error(exc)}"
                if problem is not None:
                    self._problems[name] = (FAILED, f"seed check, BS{batch_size} {mode}: {problem}")
                    break

    def _time(self, run: BatchRun) -> None:
        """The interleaved passes; fills `run.cells` for every variant."""
        rounds = self.options.rounds
        eager_steps = {name: run.step(name, "eager") for name in run.sources}
        graph_steps = {name: run.step(name, "graph") for name in run.sources}

        def order(pass_name: str) -> random.Random:
            return seeded_rng(self.options.seed, f"bs{run.batch_size}", pass_name)

        with gc_paused():
            samples = {
                "eager": interleaved(
                    eager_steps,
                    rounds=rounds,
                    burst=EAGER_BURST,
                    timer=device_us_per_step,
                    rng=order("eager"),
                ),
                "graph": interleaved(
                    graph_steps,
                    rounds=rounds,
                    burst=GRAPH_BURST,
                    timer=device_us_per_step,
                    rng=order("graph"),
                ),
            }
            host = interleaved(
                eager_steps, rounds=rounds, burst=1, timer=host_us_per_step, rng=order("host")
            )
        for spec in self.specs:
            for mode in MODES:
                if spec.name in run.sources:
                    cell = Cell(
                        spec.name,
                        mode,
                        run.batch_size,
                        step_us=tuple(samples[mode][spec.name]),
                        host_us=tuple(host[spec.name]) if mode == "eager" else (),
                    )
                else:
                    status, reason = self._problems[spec.name]
                    cell = Cell(spec.name, mode, run.batch_size, status=status, reason=reason)
                run.cells[spec.name, mode] = cell
