# Lands around the DBO capture forward in ModelCudaGraphManager.capture's
# ubatch_forward_fn (the reset design; releases with DBO in the V2 runner).

forward_hooks.forward(
    ForwardInfo(
        runs_ssu=batch_runs_mamba_ssu(
            [c.attn_metadata for c in ubatch_state.forward_contexts]
        ),
        micro_batched=True,
        full_cudagraph=(
            desc.cg_mode == CUDAGraphMode.FULL and not warmup
        ),
    )
)
