# Lands in tests/kernels/mamba/test_sr_seed_prefetch.py for the forward-context
# design (vllm_patch/fork_test.py): its import in place of the vendored package's,
# sorted among the file's imports, and its open_forward fixture in place of the
# reset design's.

from vllm.forward_context import ForwardContext, override_forward_context


@pytest.fixture
def open_forward() -> OpenForward:
    """Opens a forward as the model runners do: under a new forward context,
    whose identity tells the prefetcher one forward from the next (a FULL
    graph capture needs no other mark)."""

    def forward(full_cudagraph: bool = False) -> AbstractContextManager[None]:
        return override_forward_context(
            ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
        )

    return forward
