"""bench/engine/spans.py: the GPU spans of forwards and replays, and their merge over ranks."""

from __future__ import annotations

import pytest
import torch

from . import spans as engine_spans
from .arms import GraphMode
from .cpu_fakes import FakeGpu, mamba_metadata, runner_module


def test_replay_spans_sum_each_steps_replays() -> None:
    class Pair:
        def __init__(self, ms: float) -> None:
            self.ms = ms

        def elapsed_time(self, end: object) -> float:
            return self.ms

    spans = engine_spans.ReplaySpans()
    spans.pairs.extend((Pair(ms), None, True) for ms in (1.0, 2.0, 4.0))
    # Step 0 replays once, step 1 not at all (None), step 2 twice.
    assert spans.per_step([1, 1, 3]) == [1e-3, None, 6e-3]


def test_replay_spans_start_behind_a_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start event is recorded after the spin and before the replay, so the
    host's enqueuing of the replay falls inside the spin, not the span."""
    import torch

    calls: list[str] = []

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing

        def record(self) -> None:
            calls.append("record")

    class Graph:
        def replay(self) -> None:
            calls.append("replay")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append(f"spin {cycles}"))
    spans = engine_spans.ReplaySpans()
    spans.install()
    Graph().replay()
    assert calls == [f"spin {engine_spans.SPIN_CYCLES}", "record", "replay", "record"]
    assert len(spans.pairs) == 1


def test_an_early_start_spans_the_draw_before_the_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """open_early's start (before an eager draw) is the next replay's, behind one
    spin; a start the GPU had already reached by the replay (the host outlasted
    the spin) leaves its step uncovered, and a start no replay took is dropped."""
    import torch

    calls: list[str] = []
    reached = [False]

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing

        def record(self) -> None:
            calls.append("record")

        def query(self) -> bool:
            return reached[0]

        def elapsed_time(self, end: object) -> float:
            return 1.0

    class Graph:
        def replay(self) -> None:
            calls.append("replay")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append("spin"))
    spans = engine_spans.ReplaySpans()
    spans.install()
    spans.open_early()
    calls.append("draw")
    Graph().replay()
    assert calls == ["spin", "record", "draw", "replay", "record"]
    reached[0] = True
    spans.open_early()
    Graph().replay()
    assert spans.per_step([1, 2]) == [1e-3, None]
    calls.clear()
    spans.open_early()
    spans.close_early()
    Graph().replay()  # a start of its own
    assert calls == ["spin", "record", "spin", "record", "replay", "record"]
    spans.timing = False
    calls.clear()
    spans.open_early()
    assert calls == []


def test_kernels_per_step_reads_torchs_averages() -> None:
    class Average:
        def __init__(self, key: str, count: int, device_us: float) -> None:
            self.key, self.count, self.self_device_time_total = key, count, device_us

    class OldAverage:  # torch before 2.4
        key, count, self_cuda_time_total = "old_kernel", 8, 16.0

    averages = [Average("ssu", 160, 800.0), Average("cpu_only_op", 4, 0.0), OldAverage()]
    assert engine_spans.kernels_per_step(averages, steps=4) == [
        ["ssu", 40.0, 200.0],
        ["old_kernel", 2.0, 4.0],
    ]


def test_merged_spans_take_the_slowest_rank_of_each_forward() -> None:
    ranks = [
        {"forward_s": [1.0, 2.0, 3.0], "replay_s": [1.0, None, 3.0], "replays": 2},
        {"forward_s": [2.0, 1.0, 3.0], "replay_s": [1.5, None, 2.0], "replays": 2},
    ]
    merged = engine_spans.merge_spans(ranks)
    assert merged == {
        "forward_s": 2.0,  # median of 2, 2, 3
        "forwards": 3,
        "replay_s": 2.25,  # median of 1.5, 3.0: forward 1 replayed nothing
        "replay_spread_s": 0.75,  # median of 0.5, 1.0
        "rank_replay_s": [2.0, 1.75],
    }
    with pytest.raises(engine_spans.RankError, match=r"different numbers of forwards: \[3, 2\]"):
        engine_spans.merge_spans([ranks[0], {"forward_s": [1.0, 2.0], "replay_s": [None, None]}])


def test_merged_spans_of_one_rank_are_its_own() -> None:
    """TP 1 as before: the median forward, and the median replay of the forwards that replayed."""
    one = {"forward_s": [3e-3, 1e-3, 2e-3, 5e-3], "replay_s": [1e-3, None, 4e-3, 2e-3]}
    merged = engine_spans.merge_spans([one])
    assert merged["forward_s"] == 2.5e-3 and merged["forwards"] == 4
    assert merged["replay_s"] == 2e-3 and merged["replay_spread_s"] == 0.0
    assert merged["rank_replay_s"] == [2e-3]


def test_rank_spans_split_replays_by_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace as NS

    clock = [0.0]

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.at = 0.0

        def record(self) -> None:
            clock[0] += 1.0
            self.at = clock[0]

        def elapsed_time(self, end: Event) -> float:
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    replays = engine_spans.ReplaySpans()

    def execute_model(graphs: int) -> str:
        for _ in range(graphs):  # as the wrapped CUDAGraph.replay records
            start, end = Event(), Event()
            start.record()
            end.record()
            replays.pairs.append((start, end, True))
        return "output"

    runner = NS(execute_model=execute_model)
    spans = engine_spans.RankSpans(replays)
    spans.install(NS(model_runner=runner))
    assert [runner.execute_model(n) for n in (1, 0, 2)] == ["output"] * 3
    taken = spans.take()
    assert taken["replays"] == 3 and len(taken["forward_s"]) == 3
    assert taken["replay_s"] == [1e-3, None, 2e-3]
    assert spans.take() == {"forward_s": [], "replay_s": [], "replays": 0}


def test_a_forward_s_gpu_time_is_its_kernels_behind_spins(monkeypatch) -> None:
    """Each segment's spin outlasts the host's enqueuing of it, so the spans
    sum to the kernels' GPU time, not the host's; a forward a spin did not
    cover (a sync inside) is left out; a forward that raises leaves nothing."""
    gpu = FakeGpu(monkeypatch)
    module, opened = runner_module(monkeypatch)
    spans = engine_spans.ForwardGpuSpans()
    spans.install(module)
    piecewise = GraphMode.PIECEWISE

    def forward(host_s: float, gpu_s: float, sync_at: int = -1) -> None:
        metadata = mamba_metadata(2, 1, 126)
        with module.set_forward_context(metadata, None, cudagraph_runtime_mode=piecewise):
            gpu.forward(40, host_s, gpu_s, sync_at)

    forward(host_s=10e-3, gpu_s=3e-3)  # not watched: passed through
    assert spans.take() == {"batches": [], "host_s": [], "segments_s": [], "uncovered": 0}
    assert len(opened) == 1 and spans.spin_cycles(0) == engine_spans.FORWARD_SPIN_FIRST_S * 2e9

    spans.watching = True
    forward(host_s=10e-3, gpu_s=3e-3)  # watched, not spun: its batch and host time
    gpu.synchronize()
    assert spans.take() == {
        "batches": [["PIECEWISE", 2, 1, 126]],
        "host_s": [pytest.approx(10e-3)],
        "segments_s": [None],
        "uncovered": 0,
    }
    # 40 replays: 5 segments of 8, each about a fifth of the host's time.
    measured = spans.segment_host_s
    assert measured == [pytest.approx(2e-3, rel=0.02)] * 5
    assert spans.spin_cycles(1) == pytest.approx(2 * 2e-3 * 2e9)
    assert spans.spin_cycles(7) == spans.spin_cycles(0)  # beyond the last: the longest
    spans.segment_host_s = [1e-6]
    assert spans.spin_cycles(0) == engine_spans.FORWARD_SPIN_MIN_S * 2e9
    spans.segment_host_s = [2.0]
    assert spans.spin_cycles(0) == engine_spans.FORWARD_SPIN_MAX_S * 2e9
    spans.segment_host_s = measured

    spans.spinning = True
    forward(host_s=10e-3, gpu_s=3e-3)
    forward(host_s=10e-3, gpu_s=3e-3)
    forward(host_s=12e-3, gpu_s=4e-3)  # a fifth more host time than the forward before
    forward(host_s=10e-3, gpu_s=3e-3, sync_at=20)
    with (
        pytest.raises(ValueError, match="inside the forward"),
        module.set_forward_context({}, None, cudagraph_runtime_mode=piecewise),
    ):
        raise ValueError("inside the forward")
    gpu.synchronize()
    taken = spans.take()
    assert [sum(s) if s else None for s in taken["segments_s"]] == [
        pytest.approx(3e-3),
        pytest.approx(3e-3),
        pytest.approx(4e-3),
        None,
    ]
    assert [len(s) for s in taken["segments_s"][:3]] == [5, 5, 5]
    assert taken["uncovered"] == 1 and len(taken["batches"]) == 4 and len(opened) == 7


def test_segments_keep_the_launch_queue_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """400 launches a forward on a stream that holds 100: a spin covers a
    segment of 8 replays (80 launches), not the whole forward (the control)."""
    gpu = FakeGpu(monkeypatch, depth=100)
    module, _ = runner_module(monkeypatch)
    spans = engine_spans.ForwardGpuSpans()
    spans.install(module)
    spans.watching = spans.spinning = True

    def forwards(n: int) -> list:
        for _ in range(n):
            with module.set_forward_context({}, None, cudagraph_runtime_mode=None):
                gpu.forward(40, host_s=10e-3, gpu_s=3e-3)
        gpu.synchronize()
        return [sum(s) if s else None for s in spans.take()["segments_s"]]

    assert forwards(3)[1:] == [pytest.approx(3e-3)] * 2
    monkeypatch.setattr(engine_spans, "FORWARD_SEGMENT_REPLAYS", 1000)  # one segment a forward
    assert forwards(3)[1:] == [None, None]


def test_a_forward_s_batch_is_read_off_its_mamba_metadata() -> None:
    assert engine_spans.mamba_batch(mamba_metadata(4, 2, 124)) == [4, 2, 124]
    assert engine_spans.mamba_batch([mamba_metadata(4, 2, 124)]) == [None, None, None]
    assert engine_spans.mamba_batch(None) == [None, None, None]


def test_merged_gpu_spans_take_the_fastest_rank_of_each_segment() -> None:
    ranks = [
        {"segments_s": [[1.0, 2.0], None, [3.0, 1.0]], "host_s": [5.0, 9.0, 4.0]},
        {"segments_s": [[2.0, 1.0], [2.0, 2.0], [2.5, 1.5]], "host_s": [6.0, 1.0, 4.0]},
    ]
    assert engine_spans.merge_forward_gpu(ranks) == {
        "forward_gpu_s": 2.75,  # median of 1 + 1, 2.5 + 1: forward 1 was uncovered on rank 0
        "gpu_forwards": 2,
        "gpu_uncovered": 1,
        "spun_host_s": 6.0,  # median of 6, 9, 4
    }
    uncovered = [{"segments_s": [None], "host_s": [1.0]}]
    assert engine_spans.merge_forward_gpu(uncovered)["forward_gpu_s"] is None
    with pytest.raises(engine_spans.RankError, match=r"different numbers of forwards: \[3, 1\]"):
        engine_spans.merge_forward_gpu([ranks[0], {"segments_s": [[1.0]], "host_s": [1.0]}])
    with pytest.raises(engine_spans.RankError, match="a forward in different segments"):
        engine_spans.merge_forward_gpu(
            [
                {"segments_s": [[1.0]], "host_s": [1.0]},
                {"segments_s": [[1.0, 1.0]], "host_s": [1.0]},
            ]
        )


@pytest.mark.parametrize(
    ("batches", "error"),
    [
        ([["PIECEWISE", 2, 1, 126], ["PIECEWISE", 2, 2, 126]], None),
        ([], "no forward was watched"),
        ([["PIECEWISE", 2, 1, 126], ["NONE", 2, 1, 254]], "forward 1 ran 2 decodes and 1 "),
        ([["PIECEWISE", 3, 1, 125]], "ran 3 decodes"),
        ([["PIECEWISE", 2, 0, 0]], "and 0 prefills"),
        ([["FULL", 2, 0, 0]], "in CUDA-graph mode FULL: not a mixed step of 2 decodes"),
    ],
)
def test_a_mixed_step_is_decodes_beside_a_prefill_on_piecewise_graphs(batches, error) -> None:
    got = engine_spans.mixed_batch_error(batches, bs=2)
    assert got is None if error is None else error in got


def test_untimed_replays_are_counted_with_no_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    class Graph:
        def replay(self) -> None:
            calls.append("replay")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append("spin"))
    replays = engine_spans.ReplaySpans()
    replays.install()
    replays.timing = False
    Graph().replay()
    Graph().replay()
    assert calls == ["replay", "replay"] and replays.pairs == [] and replays.untimed == 2
    spans = engine_spans.RankSpans(replays)
    assert spans.take()["replays"] == 2 and replays.untimed == 0
