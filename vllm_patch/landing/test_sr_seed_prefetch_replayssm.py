# Lands in tests/kernels/mamba/test_sr_seed_prefetch.py, merged, where the release
# has FlashInfer's ReplaySSM call (vllm_patch/fork_test.py): SSU_CALLS in place of the
# file's, and the fixture before its first test; a keyword the release's function
# does not take is dropped.

SSU_CALLS = ["flashinfer_ssu", "flashinfer_replayssm"]


@pytest.fixture
def flashinfer_replayssm(
    monkeypatch: pytest.MonkeyPatch, initialize: Callable[..., None]
) -> SSUCalls:
    """FlashInfer's ReplaySSM call as MambaMixer2 makes it, over a recording
    kernel, with seed prefetching on: state, x, dt, A, B, C, out (x-shaped where
    it reshapes them), the ring buffers and trackers (left alone)."""
    checkpointing = pytest.importorskip("flashinfer.mamba.checkpointing_ssu")
    recorder = SeedRecorder()
    monkeypatch.setattr(checkpointing, "checkpointing_ssu", recorder)
    initialize(MambaBackendEnum.FLASHINFER, prefetch=True, use_replayssm=True)
    x, other = torch.zeros(1, 2, 4, device="cuda"), torch.zeros(1, device="cuda")

    def run_layers(num_calls: int) -> None:
        for _ in range(num_calls):
            ssu_dispatch.selective_state_update_replayssm_flashinfer(
                other,
                x,
                x,
                other,
                x,
                x,
                x,
                x_cache=other,
                B_cache=other,
                dt_cache=other,
                ring_start=other,
                prev_num_accepted_tokens=other,
                prev_query_len=other,
                logical_window=4,
                update_trackers=False,
                enable_stochastic_rounding=True,
                stochastic_rounding_philox_rounds=5,
            )

    return recorder, run_layers
