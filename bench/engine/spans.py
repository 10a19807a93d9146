"""The timing's GPU spans, taken on each rank (worker.py installs them there through
collective_rpc): CUDA events around execute_model and each CUDA-graph replay, the
mixed steps' forwards timed kernel by kernel behind spins, and torch.profiler's
kernels per step; and their merge over the TP ranks."""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any


class RankError(RuntimeError):
    """The TP ranks' replies to a collective_rpc are not one from every rank."""


class ForwardSpans:
    """CUDA events around the model runner's `execute_model`, one pair per call.

    A pair spans, on the GPU's timeline, from where the host entered
    execute_model (input preparation, then the forward: a graph replay, or
    the eager / piecewise kernels) to where it left: the step's forward as
    the GPU sees it, without the scheduler, sampling and output processing
    around it (whose host time the wall clock carries).
    """

    def __init__(self) -> None:
        self.pairs: list[tuple[Any, Any]] = []

    def install(self, worker: Any, on_end: Callable[[], None] = lambda: None) -> None:
        """Wraps the worker's execute_model; `on_end()` runs as each call ends."""
        import torch

        runner = worker.model_runner
        original = runner.execute_model

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                return original(*args, **kwargs)
            finally:
                end.record()
                self.pairs.append((start, end))
                on_end()

        runner.execute_model = timed

    def take(self) -> list[float]:
        """Seconds of each pair recorded since the last take (the GPU must be synchronized)."""
        pairs, self.pairs = self.pairs, []
        return [start.elapsed_time(end) / 1e3 for start, end in pairs]


SPIN_CYCLES = 200_000
"""GPU clock cycles the stream spins before each replay's start event (about
100 µs on an H200): longer than the host takes to enqueue the replay."""


class ReplaySpans:
    """CUDA events around every CUDA graph replay of this process.

    `CUDAGraph.replay()` enqueues torch's replay prologue (for a graph that
    draws from a generator, two fill kernels that hand it the generator's seed
    and offset) and then the graph, one launch.  On an idle GPU a start event
    recorded just before would also time the host enqueuing those, which only
    graphs that draw pay: the floor's graph draws nothing.  So the stream
    first spins (`SPIN_CYCLES`), the start event is recorded behind the spin,
    and by the time it fires the host has enqueued the whole replay: the pair
    spans the prologue's kernels and the graph's back to back on the GPU, what
    the microbenchmark's graph mode times.  A replay whose seeds are drawn
    eagerly just before it (the reset design's: no RNG inside its graph) starts
    the pair before the draw (open_early), so that the pair holds the draw as
    stock's holds the draws inside its graph.
    """

    def __init__(self) -> None:
        self.pairs: list[tuple[Any, Any, bool]] = []  # start, end, covered
        # False: replays run as torch's, no spin and no events, only counted
        # (untimed): the mixed workload times whole forwards (ForwardGpuSpans).
        self.timing = True
        self.untimed = 0
        self._early: Any = None  # open_early's start, until a replay takes it

    def open_early(self) -> None:
        """Starts the next replay's pair here, behind the spin: for a replay
        whose seeds are drawn eagerly just before it (the reset design's arms,
        worker._time_replays_from_the_draw), so that the pair spans the draw and
        its launch gap as well.  A replay that finds this start already reached
        (the host took longer than the spin) leaves its step uncovered (None),
        not short."""
        import torch

        if not self.timing:
            return
        torch.cuda._sleep(SPIN_CYCLES)
        self._early = torch.cuda.Event(enable_timing=True)
        self._early.record()

    def close_early(self) -> None:
        """Drops a start no replay took (its forward replayed nothing; or, at the
        end of execute_model, RankSpans, one opened before a replay that did not
        come)."""
        self._early = None

    def install(self) -> None:
        import torch

        original = torch.cuda.CUDAGraph.replay
        pairs = self.pairs

        def replay(graph: Any) -> None:
            if not self.timing:
                self.untimed += 1
                original(graph)
                return
            start, self._early = self._early, None
            covered = True
            if start is None:
                start = torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(SPIN_CYCLES)
                start.record()
            else:
                covered = not start.query()
            end = torch.cuda.Event(enable_timing=True)
            original(graph)
            end.record()
            pairs.append((start, end, covered))

        torch.cuda.CUDAGraph.replay = replay  # type: ignore[method-assign]

    def per_step(self, marks: list[int]) -> list[float | None]:
        """Seconds of replay per step, marks[i] being the pair count after step
        i (the GPU must be synchronized); None for a step without a replay, or
        with an uncovered one (open_early)."""
        totals: list[float | None] = []
        begin = 0
        for mark in marks:
            step = self.pairs[begin:mark]
            covered = bool(step) and all(c for _, _, c in step)
            totals.append(sum(s.elapsed_time(e) for s, e, _ in step) / 1e3 if covered else None)
            begin = mark
        return totals


class RankSpans:
    """One rank's timers: its forward spans, and the process's replay spans
    split by forward (the pair count as each execute_model call ends).  A
    replay's start opened early that no replay took by then is dropped, so that
    it cannot start a later step's replay."""

    def __init__(self, replays: ReplaySpans) -> None:
        self.forwards = ForwardSpans()
        self.replays = replays
        self.marks: list[int] = []

    def install(self, worker: Any) -> None:
        self.forwards.install(worker, on_end=self._forward_ended)

    def _forward_ended(self) -> None:
        self.replays.close_early()
        self.marks.append(len(self.replays.pairs))

    def take(self) -> dict[str, Any]:
        """Per forward since the last take: its seconds, and its replays'
        (None for none); and how many replays (the GPU must be synchronized)."""
        replays = self.replays.per_step(self.marks)
        count = len(self.replays.pairs) + self.replays.untimed
        self.replays.pairs.clear()
        self.replays.untimed = 0
        self.marks = []
        return {"forward_s": self.forwards.take(), "replay_s": replays, "replays": count}


SPIN_CYCLES_PER_S = 2e9
"""More GPU clock cycles per second than an H200 runs (its top SM clock is 1980
MHz): a spin of s x SPIN_CYCLES_PER_S cycles lasts at least s seconds."""
FORWARD_SEGMENT_REPLAYS = 8
"""A spun forward is timed in segments of this many CUDA graph replays and the
eager kernels after them (a PIECEWISE forward replays a piece between every two
of its attention and Mamba-2 layers, whose kernels run eagerly), each behind a
spin of its own: the host enqueues at most a segment ahead of the GPU, well
short of the about 1000 launches a stream holds before the host blocks."""
FORWARD_SPIN_MARGIN = 2.0
"""A segment's spin, in multiples of the host's time in that segment of the
forward before."""
FORWARD_SPIN_MIN_S = 1e-3
"""The shortest spin: a host pause (a garbage collection) up to about this long
still leaves the segment covered."""
FORWARD_SPIN_FIRST_S = 0.05
"""The spin of a segment no forward before has timed."""
FORWARD_SPIN_MAX_S = 0.5
"""The longest spin: a segment whose host time is longer is left uncovered."""


def mamba_batch(attn_metadata: Any) -> list[int | None]:
    """[decodes, prefills, prefill tokens] of a forward's batch, read off its
    attn_metadata (layer name -> metadata, as both runners pass it to
    set_forward_context) at the first layer with Mamba metadata (vLLM's
    BaseMambaAttentionMetadata); Nones where there is none."""
    if isinstance(attn_metadata, dict):
        for metadata in attn_metadata.values():
            counts = [
                getattr(metadata, name, None)
                for name in ("num_decodes", "num_prefills", "num_prefill_tokens")
            ]
            if all(isinstance(count, int) for count in counts):
                return counts
    return [None, None, None]


class ForwardGpuSpans:
    """CUDA events around each forward a model runner opens: the body of its
    `with set_forward_context(...)` (sr_seed_forward's seed draws, the model's eager
    kernels and piecewise replays), in segments (FORWARD_SEGMENT_REPLAYS), each
    behind a spin, as ReplaySpans times a replay.

    A segment's spin lasts FORWARD_SPIN_MARGIN x the host's time in that
    segment of the forward before, so the GPU reaches the segment's start
    event only after the host has enqueued all of it: each pair spans the
    segment's kernels back to back, not the host's gaps between them, and the
    forward's GPU time is their sum.  Each segment checks that: if its start
    event has completed by the time the host leaves it (a sync inside, a full
    launch queue, a spin too short), the pair holds host time, and the forward
    is uncovered (no figure).  While watching, each forward also leaves its
    batch: the CUDA-graph mode it ran in, and mamba_batch's counts.
    """

    def __init__(self) -> None:
        self.watching = False  # record each forward's batch
        self.spinning = False  # and time it behind spins
        # The host's seconds in each segment of the last watched forward.
        self.segment_host_s: list[float] = []
        self._inside = False
        self.reset()

    def reset(self) -> None:
        self.batches: list[list[Any]] = []
        self.host_times: list[float] = []
        # Per forward: its segments' (start, end, covered); None where not spun.
        self.segments: list[list[tuple[Any, Any, bool]] | None] = []

    def spin_cycles(self, segment: int) -> int:
        """The spin of a forward's `segment`-th segment (SPIN_CYCLES_PER_S a second)."""
        hosts = self.segment_host_s
        host = hosts[segment] if segment < len(hosts) else max(hosts, default=None)
        seconds = FORWARD_SPIN_FIRST_S if host is None else FORWARD_SPIN_MARGIN * host
        seconds = min(max(seconds, FORWARD_SPIN_MIN_S), FORWARD_SPIN_MAX_S)
        return int(seconds * SPIN_CYCLES_PER_S)

    def install(self, module: Any) -> None:
        """Wraps the set_forward_context of `module`, a runner's module, which
        its execute_model calls by that name, and CUDAGraph.replay (where the
        segments of a watched forward end)."""
        import torch

        original = module.set_forward_context
        original_replay = torch.cuda.CUDAGraph.replay

        @contextlib.contextmanager
        def watched(attn_metadata: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            if not self.watching:
                with original(attn_metadata, *args, **kwargs) as context:
                    yield context
                return
            self._begin()
            try:
                with original(attn_metadata, *args, **kwargs) as context:
                    yield context
            finally:
                self._inside = False
            self._end()
            mode = kwargs.get("cudagraph_runtime_mode")
            self.batches.append([getattr(mode, "name", mode), *mamba_batch(attn_metadata)])

        def replay(graph: Any) -> None:
            if self._inside:
                if self._replays and self._replays % FORWARD_SEGMENT_REPLAYS == 0:
                    self._close()
                    self._open()
                self._replays += 1
            original_replay(graph)

        module.set_forward_context = watched
        torch.cuda.CUDAGraph.replay = replay  # type: ignore[method-assign]

    def _begin(self) -> None:
        import torch

        self._pairs: list[tuple[Any, Any, bool]] = []
        self._hosts: list[float] = []
        self._replays = 0
        self._inside = True
        if self.spinning:
            # Spins outlast the host: without a sync between forwards the GPU
            # would fall further behind each one, until the launch queue fills.
            torch.cuda.synchronize()
        self._open()

    def _open(self) -> None:
        import torch

        self._start = None
        if self.spinning:
            self._start = torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(self.spin_cycles(len(self._hosts)))
            self._start.record()
        self._began = time.perf_counter()

    def _close(self) -> None:
        import torch

        self._hosts.append(time.perf_counter() - self._began)
        if self._start is not None:
            covered = not self._start.query()
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pairs.append((self._start, end, covered))

    def _end(self) -> None:
        self._close()
        self.segment_host_s = self._hosts
        self.host_times.append(sum(self._hosts))
        self.segments.append(self._pairs if self.spinning else None)

    def take(self) -> dict[str, Any]:
        """Per forward since the last take: its batch, the host's seconds in
        its body, and its segments' seconds (None: not spun, or a segment
        uncovered); how many spun forwards were uncovered (the GPU must be
        synchronized)."""
        segments, batches, host_times = self.segments, self.batches, self.host_times
        self.reset()
        return {
            "batches": batches,
            "host_s": host_times,
            "segments_s": [
                None
                if pairs is None or not all(covered for _, _, covered in pairs)
                else [start.elapsed_time(end) / 1e3 for start, end, _ in pairs]
                for pairs in segments
            ],
            "uncovered": sum(
                pairs is not None and not all(covered for _, _, covered in pairs)
                for pairs in segments
            ),
        }


# This process's (under TP, a rank's) timers, set by _install_spans (the
# forwards' by _watch_forwards), and profiler, between _start_profile and
# _stop_profile.
_REPLAYS: ReplaySpans | None = None
_SPANS: RankSpans | None = None
_FORWARDS: ForwardGpuSpans | None = None
_PROFILE: Any = None


def _install_spans(worker: Any) -> None:
    """This rank's timers on `worker`; CUDAGraph.replay is wrapped once per process."""
    global _REPLAYS, _SPANS
    if _REPLAYS is None:
        _REPLAYS = ReplaySpans()
        _REPLAYS.install()
    _SPANS = RankSpans(_REPLAYS)
    _SPANS.install(worker)


def _watch_forwards(worker: Any, spin: bool | None) -> None:
    """This rank's forwards watched (ForwardGpuSpans; spin: timed behind a
    spin too) and its replays counted untimed; spin None: neither, the decode
    timers as they were.  The runner module's set_forward_context is wrapped
    once per process, at the first call."""
    global _FORWARDS
    assert _REPLAYS is not None, "_install_spans first"
    if _FORWARDS is None:
        _FORWARDS = ForwardGpuSpans()
        _FORWARDS.install(sys.modules[type(worker.model_runner).__module__])
    _FORWARDS.reset()
    _FORWARDS.watching, _FORWARDS.spinning = spin is not None, bool(spin)
    _REPLAYS.timing = spin is None


def _take_forwards(worker: Any) -> dict[str, Any]:
    assert _FORWARDS is not None, "_watch_forwards first"
    _synchronize(worker)
    return _FORWARDS.take()


def _synchronize(_worker: Any) -> None:
    import torch

    torch.cuda.synchronize()


def open_replay_early() -> None:
    """This process's next replay span starts here (ReplaySpans.open_early),
    once the timers are installed."""
    if _REPLAYS is not None:
        _REPLAYS.open_early()


def close_replay_early() -> None:
    if _REPLAYS is not None:
        _REPLAYS.close_early()


def _take_spans(worker: Any) -> dict[str, Any]:
    assert _SPANS is not None, "_install_spans first"
    _synchronize(worker)
    return _SPANS.take()


def _start_profile(_worker: Any) -> None:
    global _PROFILE
    from torch.profiler import ProfilerActivity, profile

    _synchronize(_worker)
    _PROFILE = profile(activities=[ProfilerActivity.CUDA])
    _PROFILE.start()


def _stop_profile(worker: Any, steps: int) -> list[list[Any]]:
    global _PROFILE
    _synchronize(worker)
    trace, _PROFILE = _PROFILE, None
    trace.stop()
    return kernels_per_step(trace.key_averages(), steps)


def _median(values: Iterable[float]) -> float | None:
    kept = list(values)
    return statistics.median(kept) if kept else None


def merge_spans(ranks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A decode burst's GPU figures from every rank's RankSpans.take (in rank
    order).  Per forward the slowest rank's span: the ranks meet in every
    layer's all-reduce, so a step lasts as long as its slowest rank; the
    median of that over forwards (forward_s, replay_s; at TP 1 the one
    rank's).  Beside it each rank's own median replay, and the spread: the
    median over forwards of the slowest rank's replay less the fastest's."""
    counts = [len(rank["forward_s"]) for rank in ranks]
    if len(set(counts)) > 1:
        raise RankError(f"the ranks timed different numbers of forwards: {counts}")
    forwards = [max(spans) for spans in zip(*(rank["forward_s"] for rank in ranks), strict=True)]
    replayed = [
        [span for span in spans if span is not None]
        for spans in zip(*(rank["replay_s"] for rank in ranks), strict=True)
    ]
    replayed = [spans for spans in replayed if spans]
    return {
        "forward_s": _median(forwards),
        "forwards": len(forwards),
        "replay_s": _median(max(spans) for spans in replayed),
        "replay_spread_s": _median(max(spans) - min(spans) for spans in replayed),
        "rank_replay_s": [
            _median(span for span in rank["replay_s"] if span is not None) for rank in ranks
        ],
    }


def merge_forward_gpu(ranks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A spun burst's GPU figure from every rank's ForwardGpuSpans.take (in rank
    order): per forward that every rank covered, the sum over its segments of
    the fastest rank's span (a rank whose spin ends first waits, inside its
    span, at the segment's first all-reduce for the others; the one whose spin
    ends last waits for none), and the median of that over forwards
    (forward_gpu_s; at TP 1 the one rank's); how many forwards it holds, and
    how many were left out; and the median of the host's time in a forward's
    body (its slowest rank's), which the spins must outlast."""
    counts = [len(rank["segments_s"]) for rank in ranks]
    if len(set(counts)) > 1:
        raise RankError(f"the ranks watched different numbers of forwards: {counts}")
    forwards = list(zip(*(rank["segments_s"] for rank in ranks), strict=True))
    covered = [segments for segments in forwards if None not in segments]
    for segments in covered:
        if len({len(spans) for spans in segments}) > 1:
            raise RankError(f"the ranks timed a forward in different segments: {segments}")
    totals = [sum(map(min, zip(*segments, strict=True))) for segments in covered]
    return {
        "forward_gpu_s": _median(totals),
        "gpu_forwards": len(totals),
        "gpu_uncovered": len(forwards) - len(covered),
        "spun_host_s": _median(map(max, zip(*(rank["host_s"] for rank in ranks), strict=True))),
    }


def mixed_batch_error(batches: Sequence[Sequence[Any]], bs: int) -> str | None:
    """Why the forwards of `batches` (ForwardGpuSpans') are not all mixed steps
    of `bs` decodes beside a prefill chunk on piecewise graphs; None if they are."""
    if not batches:
        return "no forward was watched: the runner did not call its set_forward_context"
    for index, (mode, decodes, prefills, _) in enumerate(batches):
        if mode != "PIECEWISE" or decodes != bs or not prefills:
            return (
                f"forward {index} ran {decodes} decodes and {prefills} prefills in CUDA-graph "
                f"mode {mode}: not a mixed step of {bs} decodes beside a prefill chunk on "
                "piecewise graphs"
            )
    return None


def kernels_per_step(averages: Iterable[Any], steps: int) -> list[list[Any]]:
    """[name, launches per step, device µs per step] of every kernel torch's
    profiler timed (its key_averages()), the most device time first."""
    rows = []
    for average in averages:
        device_us = getattr(average, "self_device_time_total", None)
        if device_us is None:  # torch before 2.4 named it after CUDA
            device_us = average.self_cuda_time_total
        if device_us > 0:
            rows.append([average.key, average.count / steps, round(device_us / steps, 2)])
    return sorted(rows, key=lambda row: -row[2])
