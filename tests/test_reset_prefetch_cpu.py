"""The reset design's prefetcher (runner_hooks/core) on the CPU, CUDA faked: what each
forward draws and where its seeds come from, how the generator moves (eager, captured
with the forward begun outside the capture or inside it, replayed), and the checks at
a forward's first and last seed, each shown to fail without its check. On the GPU,
against stock: tests/gpu."""

from __future__ import annotations

import ast
from collections.abc import Callable

import pytest
import torch

from runner_hooks import SeedPrefetch, SRSeedPrefetcher
from runner_hooks.core import prefetch as core
from vllm_patch import releases, sdist

from .cuda_fakes import Cuda, fake_cuda

N = 4


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


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Cuda:
    return fake_cuda(monkeypatch, Cuda())


@pytest.fixture
def generator(monkeypatch: pytest.MonkeyPatch) -> FakeGenerator:
    made = FakeGenerator()
    monkeypatch.setattr(torch.cuda, "default_generators", (made,))
    return made


@pytest.fixture
def warnings(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, ...]]:
    """The arguments of each `logger.warning_once` call (vLLM's logger, once per message)."""
    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(core.logger, "warning_once", lambda *args: calls.append(args))
    return calls


def prefetcher(generator: FakeGenerator, num_seeds: int = N) -> SRSeedPrefetcher:
    prefetch = SeedPrefetch("reset", num_seeds, torch.device("cpu"), generator.draw)
    prefetch._device_index = 0  # the fake generator's
    return SRSeedPrefetcher(prefetch)


def take_all(p: SRSeedPrefetcher, calls: int = N) -> list[int | None]:
    seeds = [p.next_seed() for _ in range(calls)]
    return [None if s is None else int(s) for s in seeds]


# --- what each forward draws, and the generator -------------------------------------


def test_an_eager_forward_draws_its_seeds_as_it_begins(cuda, generator) -> None:
    p = prefetcher(generator)
    with p.forward():
        assert generator.offset == 4 * N, "drawn before the first SSU call"
        assert take_all(p, N + 1) == [0, 4, 8, 12, None]
    with p.forward():
        assert take_all(p) == [16, 20, 24, 28]
    assert p.next_seed() is None, "outside a forward: stock's inline draw"


def test_a_capture_begun_inside_the_forward_leaves_the_generator_where_stock_does(
    cuda, generator
) -> None:
    """V1: the forward draws before the wrapper captures; the capture takes the
    seeds, and the forward's end puts the generator back, as stock's capture moves
    nothing."""
    p = prefetcher(generator)
    with p.forward(full_cudagraph=True):
        cuda.capturing = True
        assert take_all(p) == [0, 4, 8, 12]
        cuda.capturing = False
    assert generator.offset == 0


def test_a_forward_begun_inside_a_capture_draws_nothing(cuda, generator) -> None:
    """V2: the forward opens inside torch.cuda.graph; the graph reads the buffer,
    and each replay of it draws what the capture took, before it."""
    p = prefetcher(generator)
    cuda.capturing = True
    with p.forward(captures="graph"):
        seeds = [p.next_seed() for _ in range(N)]
    cuda.capturing = False
    assert generator.offset == 0
    buffer = p.prefetch._buffer
    assert all(
        s is not None and s.data_ptr() == buffer.seeds[k].data_ptr() for k, s in enumerate(seeds)
    )
    p.replay("graph")
    assert generator.offset == 4 * N and buffer.whole.tolist() == [0, 4, 8, 12]
    p.replay("a graph never captured")
    assert generator.offset == 4 * N


def test_a_replay_draws_what_its_capture_took(cuda, generator) -> None:
    p = prefetcher(generator)
    cuda.capturing = True
    with p.forward(captures="two seeds"):
        take_all(p, 2)
    cuda.capturing = False
    p.replay("two seeds")
    assert generator.offset == 8 and p.prefetch._buffer.whole.tolist()[:2] == [0, 4]


def test_only_a_forward_inside_a_capture_records_its_graph(cuda, generator) -> None:
    """V2's warm-up and PIECEWISE capture forwards run outside torch.cuda.graph."""
    p = prefetcher(generator)
    with p.forward(captures="warm-up"):
        take_all(p)
    p.replay("warm-up")
    assert generator.offset == 4 * N


def test_a_v1_replay_draws_before_the_graph_and_warns_not(cuda, generator, warnings) -> None:
    p = prefetcher(generator)
    with p.forward(full_cudagraph=True):
        pass  # graph.replay(): no Python SSU call
    assert generator.offset == 4 * N and not warnings
    assert p.prefetch._buffer.whole.tolist() == [0, 4, 8, 12]


def test_every_forward_and_graph_reads_one_buffer(cuda, generator) -> None:
    p = prefetcher(generator)
    with p.forward():
        eager = p.next_seed()
    with p.forward(full_cudagraph=True):
        cuda.capturing = True
        captured = p.next_seed()
        cuda.capturing = False
    assert eager is not None and captured is not None
    assert eager.data_ptr() == captured.data_ptr()


@pytest.mark.parametrize("calls", [0, 1, N - 1])
def test_an_eager_forward_that_leaves_seeds_warns(cuda, generator, warnings, calls) -> None:
    p = prefetcher(generator)
    with p.forward():
        take_all(p, calls)
    assert [args[1:] for args in warnings] == [("reset", "", N)]


def test_a_captured_forward_that_leaves_seeds_warns(cuda, generator, warnings) -> None:
    p = prefetcher(generator)
    cuda.capturing = True
    with p.forward(full_cudagraph=True):
        take_all(p, 1)
    assert [args[1:] for args in warnings] == [("reset", "captured ", N)]


def test_a_forward_that_raises_is_ended(cuda, generator) -> None:
    p = prefetcher(generator)
    with pytest.raises(KeyError), p.forward():
        p.next_seed()
        raise KeyError("from the model")
    assert p.next_seed() is None
    assert generator.offset == 4 * N, "an eager forward's draws stand, as stock's"


def test_a_capture_that_raises_is_rewound(cuda, generator) -> None:
    """V1: the capture begun inside the forward fails, and ends before it."""
    p = prefetcher(generator)
    with pytest.raises(KeyError), p.forward(full_cudagraph=True):
        cuda.capturing = True
        p.next_seed()
        cuda.capturing = False
        raise KeyError("from the model")
    assert generator.offset == 0


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
        assert take_all(p, N - 1)[-1] is None, "the last seed, checked, is refused"
        cuda.capturing = False
    assert generator.offset == 4 * N, "not a captured forward: nothing rewound"


def test_rewinding_below_zero_is_refused_with_what_to_do(cuda, generator) -> None:
    p = prefetcher(generator)
    with (
        pytest.raises(core.GeneratorRewindError, match="reseed it after capturing"),
        p.forward(full_cudagraph=True),
    ):
        cuda.capturing = True
        take_all(p)
        cuda.capturing = False
        generator.offset = 4  # reseeded during the capture


def test_the_capture_test_fails_without_the_rewind(cuda, generator, monkeypatch) -> None:
    """Mutation: without the rewind, a capture the forward encloses moves the generator."""
    monkeypatch.setattr(SeedPrefetch, "_rewind", lambda self, offsets: None)
    with pytest.raises(AssertionError):
        test_a_capture_begun_inside_the_forward_leaves_the_generator_where_stock_does(
            cuda, generator
        )


# --- the checks, once per forward ---------------------------------------------------


def reads_its_own_seeds(cuda: Cuda, generator: FakeGenerator) -> None:
    """Every forward reads seeds drawn for it: fresh each forward, none another's."""
    p = prefetcher(generator)
    seen = []
    for _ in range(3):
        with p.forward():
            seen.append(take_all(p))
    assert seen == [[0, 4, 8, 12], [16, 20, 24, 28], [32, 36, 40, 44]], seen


def no_seed_across_a_capture_boundary(cuda: Cuda, generator: FakeGenerator) -> None:
    """A forward whose first seed was taken outside a capture hands none to a capture
    it enters later (every replay would read that seed as the capture found it)."""
    p = prefetcher(generator)
    with p.forward():
        taken = [p.next_seed() for _ in range(N - 1)]
        cuda.capturing = True
        last = p.next_seed()
        cuda.capturing = False
    assert None not in taken and last is None, "a capture got a seed of an eager forward"


def wrong_stream_drawn_inline_as_stock(cuda: Cuda, generator: FakeGenerator) -> None:
    """A forward found on another stream than its draws', at its first seed or after
    it, hands its later seeds to inline draws there (they are not ordered after its
    draws), from the generator where stock's draws read it: stock's values."""
    for moved_after in (0, 1):
        p, start = prefetcher(generator), generator.offset
        cuda.stream = 1
        with p.forward():
            taken = take_all(p, moved_after)
            cuda.stream = 2
            taken += take_all(p, N - moved_after)
            assert taken[-1] is None, "a seed handed out on another stream"
            inline = torch.empty(taken.count(None), dtype=torch.int64)
            generator.draw(inline)  # the SSU calls' inline draws
        read = [s for s in taken if s is not None] + inline.tolist()
        assert read == [start + 4 * k for k in range(N)], read
        assert generator.offset == start + 4 * N
    cuda.stream = 1


GUARANTEES: list[Callable[[Cuda], None]] = [
    reads_its_own_seeds,
    no_seed_across_a_capture_boundary,
    wrong_stream_drawn_inline_as_stock,
]


@pytest.mark.parametrize("guarantee", GUARANTEES, ids=lambda g: g.__name__)
def test_each_guarantee_holds(cuda, generator, guarantee) -> None:
    guarantee(cuda, generator)


def test_a_forward_on_another_stream_warns_and_its_successor_waits_for_it(
    cuda, generator, warnings
) -> None:
    """The next forward's draws, on the first stream again, wait for the stream that
    read this forward's seeds."""
    p = prefetcher(generator)
    with p.forward():
        take_all(p, 1)
        cuda.stream = 2
        assert take_all(p, N - 1)[-1] is None
        generator.draw(torch.empty(1, dtype=torch.int64))  # its last SSU call's inline draw
    assert [args[1:] for args in warnings] == [("reset",)], "warned of no unconsumed seeds"
    handover = p.prefetch._handover
    cuda.stream = 1
    with p.forward():
        assert take_all(p) == [4 * k + 4 * N for k in range(N)]
    assert handover.recorded_on[-1] == 2 and handover.waits == 1
    assert cuda.recorded_for == [1, 2, 1], "the buffer is recorded for each stream that reads it"


def test_the_checks_run_at_the_first_and_last_seed_only(cuda, monkeypatch) -> None:
    calls = []
    check = core.SeedBatch._checked

    def counted(self: core.SeedBatch, k: int) -> bool:
        calls.append(k)
        return check(self, k)

    monkeypatch.setattr(core.SeedBatch, "_checked", counted)
    p = prefetcher(FakeGenerator(), num_seeds=40)
    with p.forward():
        take_all(p, 40)
    assert calls == [0, 39]


def unchecked(self: core.SeedBatch, k: int) -> bool:
    return True


def stream_only(self: core.SeedBatch, k: int) -> bool:
    """The check with its capture half removed."""
    return self._same_stream(k)


def capture_only(self: core.SeedBatch, k: int) -> bool:
    """The check with its stream half removed."""
    return self._same_capture_state()


@pytest.mark.parametrize(
    ("mutation", "guarantee"),
    [
        (unchecked, no_seed_across_a_capture_boundary),
        (unchecked, wrong_stream_drawn_inline_as_stock),
        (stream_only, no_seed_across_a_capture_boundary),
        (capture_only, wrong_stream_drawn_inline_as_stock),
    ],
    ids=lambda item: item.__name__,
)
def test_each_guarantees_test_fails_without_its_check(
    cuda, generator, monkeypatch, mutation, guarantee
) -> None:
    monkeypatch.setattr(core.SeedBatch, "_checked", mutation)
    with pytest.raises(AssertionError):
        guarantee(cuda, generator)


@pytest.mark.parametrize(
    "guarantee", [no_seed_across_a_capture_boundary, wrong_stream_drawn_inline_as_stock]
)
def test_each_guarantees_test_fails_without_the_check_at_the_last_seed(
    cuda, generator, monkeypatch, guarantee
) -> None:
    """Checked at the first seed alone, a forward that enters a capture or moves to
    another stream after it goes unnoticed."""
    check = core.SeedBatch._checked
    monkeypatch.setattr(core.SeedBatch, "_checked", lambda self, k: k != 0 or check(self, k))
    with pytest.raises(AssertionError):
        guarantee(cuda, generator)


# --- the V1 replay's premise, in each release --------------------------------------

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
    """V1's replay draws N whenever its batch has decodes, which is what its graph's
    capture took when every FULL graph is of a uniform batch: in each release's source
    (its cached sdist), the Mamba-2 builder supports full graphs of uniform batches
    only, and vLLM then runs mixed batches on piecewise graphs or eagerly."""
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
