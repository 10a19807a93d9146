# Lands in tests/kernels/mamba/test_sr_seed_prefetch.py for the forward-context
# design, merged (vllm_patch/fork_test.py): its import sorted among the file's, its
# open_forward and replay fixtures in place of the reset design's.

from vllm.forward_context import ForwardContext, override_forward_context


@pytest.fixture
def open_forward() -> OpenForward:
    """Opens a forward as the model runners do: under a new forward context,
    whose identity tells the prefetcher one forward from the next (a FULL
    graph capture needs no other mark)."""

    def forward(
        full_cudagraph: bool = False, captures: object = None
    ) -> AbstractContextManager[None]:
        return override_forward_context(
            ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
        )

    return forward


@pytest.fixture
def replay() -> Replay:
    """Replays a captured FULL graph as the runners do: the graph draws its own
    seeds."""

    def run(graph: torch.cuda.CUDAGraph, key: object) -> None:
        graph.replay()

    return run
