# ruff: noqa: F811  (the fixtures cuda and generator, imported from bench/test_outside_graph.py)
"""bench/engine/outside_graph_v2.py: the V2 graph manager's capture and replay
wrapped, on a stand-in of vLLM's loop (CUDA faked), and the wrapped names checked
against vLLM 0.26.0's and 0.33.0's source."""

from __future__ import annotations

import ast
import enum
import types
from dataclasses import dataclass

import pytest

from bench.test_outside_graph import N, cuda, generator, prefetcher  # noqa: F401
from vllm_patch import releases, sources

from . import outside_graph_v2

PATH = "vllm/v1/worker/gpu/cudagraph_utils.py"


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclass(frozen=True)
class Desc:
    cg_mode: CUDAGraphMode
    num_tokens: int


def stand_in(cuda, live) -> types.SimpleNamespace:
    """vLLM's V2 manager as 0.26.0-0.33.0 shape it: the base capture loop
    (warm-up, then the FULL capture of a fresh forward_fn inside the graph), the
    model manager's forward_fn opening the runner hook inside it, its replay."""

    class CudaGraphManager:
        def __init__(self, descs: list[Desc], ssu_calls: int) -> None:
            self.descs, self.ssu_calls, self.graphs = descs, ssu_calls, {}

        def capture(self, create_forward_fn, progress_bar_desc: str = "") -> None:
            for desc in self.descs:
                create_forward_fn(desc, warmup=True)(CUDAGraphMode.NONE)
                forward_fn = create_forward_fn(desc, warmup=False)
                if desc.cg_mode is CUDAGraphMode.PIECEWISE:
                    forward_fn(CUDAGraphMode.PIECEWISE)
                    continue
                cuda.capturing = True
                forward_fn(CUDAGraphMode.NONE)
                cuda.capturing = False
                self.graphs[desc] = "graph"

        def run_fullgraph(self, desc: Desc) -> None:
            assert desc in self.graphs
            self.replayed = True

    class ModelCudaGraphManager(CudaGraphManager):
        def capture(self) -> None:
            def create_forward_fn(desc: Desc, warmup: bool):
                def forward_fn(cg_mode: CUDAGraphMode) -> None:
                    full = desc.cg_mode is CUDAGraphMode.FULL and not warmup
                    with live.forward(full_cudagraph=full):
                        for _ in range(self.ssu_calls):
                            live.next_seed()

                return forward_fn

            super().capture(create_forward_fn)

        def run_fullgraph(self, desc: Desc):
            super().run_fullgraph(desc)
            return "hidden"

    return types.SimpleNamespace(
        __name__="cudagraph_utils",
        CudaGraphManager=CudaGraphManager,
        ModelCudaGraphManager=ModelCudaGraphManager,
        CUDAGraphMode=CUDAGraphMode,
    )


FULL1 = Desc(CUDAGraphMode.FULL, 1)
FULL2 = Desc(CUDAGraphMode.FULL, 2)
PIECE = Desc(CUDAGraphMode.PIECEWISE, 8)


def test_replays_draw_what_their_capture_took_and_captures_nothing(
    cuda,
    generator,
) -> None:
    live = prefetcher(generator)
    module = stand_in(cuda, live)
    outside_graph_v2.wrap_v2(module, lambda: live)
    outside_graph_v2.wrap_v2(module, lambda: live)  # once only
    manager = module.ModelCudaGraphManager([PIECE, FULL1, FULL2], N)
    manager.capture()
    # Three warm-ups and the PIECEWISE forward drew eagerly, as stock's do; the FULL
    # captures drew nothing.
    assert generator.offset == 4 * 4 * N
    assert getattr(manager, outside_graph_v2.TOOK) == {FULL1: N, FULL2: N}
    before = generator.offset
    assert manager.run_fullgraph(FULL2) == "hidden" and manager.replayed
    assert generator.offset == before + 4 * N, "the replay's N draws, before the graph"


def test_a_graph_that_took_no_seeds_replays_without_a_draw(cuda, generator) -> None:
    live = prefetcher(generator)
    module = stand_in(cuda, live)
    outside_graph_v2.wrap_v2(module, lambda: live)
    manager = module.ModelCudaGraphManager([FULL1], 0)
    manager.capture()
    before = generator.offset
    manager.run_fullgraph(FULL1)
    assert generator.offset == before and getattr(manager, outside_graph_v2.TOOK) == {FULL1: 0}


def test_without_a_live_prefetcher_the_manager_runs_as_stock(cuda, generator) -> None:
    live = prefetcher(generator)
    module = stand_in(cuda, live)
    outside_graph_v2.wrap_v2(module, lambda: None)
    manager = module.ModelCudaGraphManager([FULL1], N)
    manager.capture()
    before = generator.offset
    assert manager.run_fullgraph(FULL1) == "hidden" and generator.offset == before


def test_a_manager_without_the_names_is_refused_with_what_to_do() -> None:
    module = types.SimpleNamespace(__name__="cudagraph_utils", CudaGraphManager=object)
    with pytest.raises(outside_graph_v2.V2LayoutError, match="run the outside-graph arm on V1"):
        outside_graph_v2.wrap_v2(module, lambda: None)


@pytest.mark.parametrize("version", ["0.26.0", "0.33.0"])
def test_the_wrapped_names_are_the_releases(version: str) -> None:
    """capture(self, create_forward_fn, ...) calling create_forward_fn(desc,
    warmup=...) and run_fullgraph(self, desc), on the classes wrap_v2 names."""
    text = sources.release_files(releases.get(version), (PATH,))[PATH].decode()
    tree = ast.parse(text)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    methods = {
        (cls, item.name): [a.arg for a in item.args.args]
        for cls in ("CudaGraphManager", "ModelCudaGraphManager")
        for item in classes[cls].body
        if isinstance(item, ast.FunctionDef)
    }
    assert methods[("CudaGraphManager", "capture")][:2] == ["self", "create_forward_fn"]
    assert methods[("ModelCudaGraphManager", "run_fullgraph")] == ["self", "desc"]
    assert "super().capture(create_forward_fn" in text
    assert "create_forward_fn(desc, warmup=True)" in text
    assert "create_forward_fn(desc, warmup=False)" in text
    assert "CUDAGraphMode" in text and "desc.cg_mode" in text
