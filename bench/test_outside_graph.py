"""bench/outside_graph.py on the CPU, CUDA faked: what each forward draws, where the
seeds come from, and how the generator moves (eager, captured with the hook outside
or inside the capture, replayed). On the GPU, against stock: tests/gpu/test_outside_graph.py."""

from __future__ import annotations

import ast
import logging
from dataclasses import dataclass

import pytest
import torch

from bench import outside_graph
from runner_hooks import WrongStreamError
from runner_hooks.core import prefetch as core
from vllm_patch import releases, sdist

N = 4


@dataclass(frozen=True)
class FakeStream:
    cuda_stream: int


class FakeEvent:
    def record(self, stream: object = None) -> None:
        pass

    def wait(self, stream: object = None) -> None:
        pass


class FakeGenerator:
    """The default CUDA generator's offset; a draw of n values reads offsets o, o+4, ..."""

    def __init__(self) -> None:
        self.offset = 0

    def get_offset(self) -> int:
        return self.offset

    def set_offset(self, offset: int) -> None:
        self.offset = offset

    def draw(self, out: torch.Tensor) -> None:
        out.copy_(torch.arange(len(out)) * 4 + self.offset)
        self.offset += 4 * len(out)


@dataclass
class Cuda:
    stream: int = 1
    capturing: bool = False


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Cuda:
    state = Cuda()
    monkeypatch.setattr(core, "_current_stream_handle", lambda index: state.stream)
    monkeypatch.setattr(core, "_is_capturing", lambda: state.capturing)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: FakeStream(state.stream))
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    monkeypatch.setattr(outside_graph, "_PERSISTENT", {})
    return state


@pytest.fixture
def generator(monkeypatch: pytest.MonkeyPatch) -> FakeGenerator:
    made = FakeGenerator()
    monkeypatch.setattr(torch.cuda, "default_generators", (made,))
    return made


def prefetcher(generator: FakeGenerator) -> outside_graph.OutsideGraphPrefetcher:
    # Device index 0 on the CPU: the fake generator's.
    device = torch.device("cpu")
    made = outside_graph.outside_graph_prefetcher(N, device, generator.draw)
    made.prefetch._device_index = 0
    return made


def take_all(p: outside_graph.OutsideGraphPrefetcher, calls: int = N) -> list[int | None]:
    seeds = [p.next_seed() for _ in range(calls)]
    return [None if s is None else int(s) for s in seeds]


def test_an_eager_forward_draws_its_seeds_as_it_begins(cuda, generator) -> None:
    p = prefetcher(generator)
    with p.forward():
        assert generator.offset == 4 * N, "drawn before the first SSU call"
        assert take_all(p, N + 1) == [0, 4, 8, 12, None]
    with p.forward():
        assert take_all(p) == [16, 20, 24, 28]
    assert p.next_seed() is None, "outside a forward: stock's inline draw"


def test_a_capture_inside_the_hook_leaves_the_generator_where_stock_does(cuda, generator) -> None:
    """V1: the hook draws before the wrapper captures; the capture takes the seeds,
    and the forward's end puts the generator back, as stock's capture moves nothing."""
    p = prefetcher(generator)
    with p.forward(full_cudagraph=True):
        cuda.capturing = True
        assert take_all(p) == [0, 4, 8, 12]
        cuda.capturing = False
    assert generator.offset == 0 and p.last_capture_took == N


def test_a_capture_around_the_hook_draws_nothing(cuda, generator) -> None:
    """V2: the hook opens inside torch.cuda.graph; the graph reads the buffer."""
    p = prefetcher(generator)
    cuda.capturing = True
    with p.forward(full_cudagraph=True):
        seeds = [p.next_seed() for _ in range(N)]
    cuda.capturing = False
    assert generator.offset == 0 and p.last_capture_took == N
    assert all(
        s is not None and s.data_ptr() == p.prefetch._eager_buffer.seeds[k].data_ptr()
        for k, s in enumerate(seeds)
    )


def test_a_replay_draws_before_the_graph_and_warns_not(cuda, generator, caplog) -> None:
    p = prefetcher(generator)
    with caplog.at_level(logging.WARNING), p.forward(full_cudagraph=True):
        pass  # graph.replay(): no Python SSU call
    assert generator.offset == 4 * N and not caplog.records
    assert p.prefetch._eager_buffer.whole.tolist() == [0, 4, 8, 12]
    with p.forward(full_cudagraph=True, count=2):
        pass  # a graph whose capture took two seeds
    assert generator.offset == 4 * N + 8
    assert p.prefetch._eager_buffer.whole.tolist()[:2] == [16, 20]


def test_every_forward_and_graph_reads_one_buffer(cuda, generator) -> None:
    p = prefetcher(generator)
    with p.forward():
        eager = p.next_seed()
    with p.forward(full_cudagraph=True):
        cuda.capturing = True
        captured = p.next_seed()
        cuda.capturing = False
    again = outside_graph.outside_graph_prefetcher(N, torch.device("cpu"), generator.draw)
    assert again.prefetch is p.prefetch, "a second attach keeps the graphs' buffer"
    assert eager is not None and captured is not None
    assert eager.data_ptr() == captured.data_ptr()


def test_an_eager_forward_that_takes_no_seed_warns_too(cuda, generator, caplog) -> None:
    p = prefetcher(generator)
    with caplog.at_level(logging.WARNING, logger="bench.outside_graph"), p.forward():
        pass
    assert "consumed 0 of the 4 seeds" in caplog.records[0].getMessage()


def test_a_forward_that_leaves_seeds_warns_once(cuda, generator, caplog) -> None:
    p = prefetcher(generator)
    with caplog.at_level(logging.WARNING, logger="bench.outside_graph"):
        for calls in (1, 0):
            with p.forward():
                for _ in range(calls):
                    p.next_seed()
    assert [r.getMessage() for r in caplog.records] == [
        "outside-graph: a forward consumed 1 of the 4 seeds it drew, so its later "
        "seeds differ from stock's (warned once)"
    ]


def test_a_seed_on_another_stream_is_refused(cuda, generator) -> None:
    p = prefetcher(generator)
    with p.forward():
        cuda.stream = 2
        with pytest.raises(WrongStreamError, match="must run on the stream"):
            p.next_seed()


def test_under_capture_the_capture_stream_may_differ(cuda, generator) -> None:
    """torch.cuda.graph captures on a side stream unless told otherwise."""
    p = prefetcher(generator)
    with p.forward(full_cudagraph=True):
        cuda.capturing, cuda.stream = True, 9
        assert None not in take_all(p)
        cuda.capturing, cuda.stream = False, 1
    assert generator.offset == 0


def test_a_forward_that_enters_a_capture_midway_draws_inline(cuda, generator) -> None:
    p = prefetcher(generator)
    with p.forward():
        assert p.next_seed() is not None
        cuda.capturing = True
        assert p.next_seed() is None
        cuda.capturing = False
    assert generator.offset == 4 * N, "not a captured forward: nothing rewound"


def test_forwards_that_run_no_ssu_draw_nothing(cuda, generator) -> None:
    from runner_hooks.hooks import ForwardHooks, ForwardInfo

    p = prefetcher(generator)
    hooks = ForwardHooks()
    hooks.register(p)
    with hooks.forward(ForwardInfo(runs_ssu=False)):
        assert p.next_seed() is None
    with hooks.forward(ForwardInfo(runs_ssu=True, micro_batched=True)):
        assert p.next_seed() is None
    with hooks.forward(ForwardInfo(runs_ssu=True)):
        assert p.next_seed() is not None
    assert generator.offset == 4 * N


def test_rewinding_below_zero_is_refused_with_what_to_do(generator) -> None:
    generator.offset = 8
    outside_graph.rewind_generator(0, 8)
    assert generator.offset == 0
    with pytest.raises(outside_graph.GeneratorRewindError, match="reseed it after capturing"):
        outside_graph.rewind_generator(0, 4)


def test_the_bench_variant_replays_inside_a_forward(cuda, generator) -> None:
    """bench/variants.py's outside-graph variant: each replay of its captured step
    opens a FULL forward first, so the replay's seeds are drawn before the graph."""
    from bench.variants import ReplayingGraph
    from runner_hooks.hooks import ForwardHooks

    p = prefetcher(generator)
    hooks = ForwardHooks()
    hooks.register(p)
    replayed = []

    class Graph:
        def replay(self) -> None:
            replayed.append(generator.offset)

    ReplayingGraph(Graph(), hooks).replay()  # type: ignore[arg-type]
    assert replayed == [4 * N] and hooks.current is None


def test_the_capture_test_fails_without_the_rewind(cuda, generator, monkeypatch) -> None:
    """Mutation: without the rewind, a capture the hook encloses moves the generator."""
    monkeypatch.setattr(outside_graph, "rewind_generator", lambda index, offsets: None)
    with pytest.raises(AssertionError):
        test_a_capture_inside_the_hook_leaves_the_generator_where_stock_does(cuda, generator)


MAMBA_BUILDERS = "vllm/v1/attention/backends/mamba_attn.py"
MAMBA2_BUILDER = "vllm/v1/attention/backends/mamba2_attn.py"
COMPILATION = "vllm/config/compilation.py"


def cudagraph_support(source: str) -> dict[str, str]:
    """class name -> the AttentionCGSupport member its `_cudagraph_support` names."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if (
                isinstance(item, ast.AnnAssign)
                and isinstance(item.target, ast.Name)
                and item.target.id == "_cudagraph_support"
                and isinstance(item.value, ast.Attribute)
            ):
                found[node.name] = item.value.attr
    return found


def full_mixed_mode_downgraded(source: str) -> bool:
    """Whether resolving the graph mode turns a FULL mode for mixed batches into
    FULL_AND_PIECEWISE or FULL_DECODE_ONLY where a backend supports less than ALWAYS."""
    start = source.find("cudagraph_mode.mixed_mode() == CUDAGraphMode.FULL")
    clause = source[start : start + 1500] if start >= 0 else ""
    return all(
        text in clause
        for text in (
            "min_cg_support != AttentionCGSupport.ALWAYS",
            "cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE",
            "cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY",
        )
    )


@pytest.mark.parametrize("version", [release.version for release in releases.RELEASES])
def test_every_full_graph_of_a_mamba2_hybrid_is_a_uniform_batch(version: str) -> None:
    """The V1 replay draw's premise, in each release's source (its cached sdist): the
    Mamba-2 builder supports full graphs of uniform batches only, and vLLM then runs
    mixed batches on piecewise graphs or eagerly."""
    files = {
        path: data.decode()
        for path, data in sdist.read_members(
            version, (MAMBA_BUILDERS, MAMBA2_BUILDER, COMPILATION)
        ).items()
    }
    base = cudagraph_support(files[MAMBA_BUILDERS])
    assert base.get("BaseMambaAttentionMetadataBuilder") == "UNIFORM_BATCH"
    assert "Mamba2AttentionMetadataBuilder" not in cudagraph_support(files[MAMBA2_BUILDER])
    assert "class Mamba2AttentionMetadataBuilder(" in files[MAMBA2_BUILDER]
    assert "BaseMambaAttentionMetadataBuilder" in files[MAMBA2_BUILDER]
    assert full_mixed_mode_downgraded(files[COMPILATION])


def test_the_release_check_can_fail() -> None:
    """Mutation: a builder that supports ALWAYS, or no downgrade, is seen."""
    assert cudagraph_support(
        "class B:\n    _cudagraph_support: ClassVar[X] = AttentionCGSupport.ALWAYS\n"
    ) == {"B": "ALWAYS"}
    assert not full_mixed_mode_downgraded(
        "if cudagraph_mode.mixed_mode() == CUDAGraphMode.FULL:\n    pass\n"
    )
