# Lands in the V2 runner's execute_model (the reset design) where it runs DBO
# micro-batches (`ubatch_state`, 0.30.0 on), before the branch that replays a FULL
# graph or calls the model: what the forward hooks are told of this forward, either
# way. A micro-batched forward's attention metadata is per micro-batch, in
# ubatch_state's forward contexts. ATTN_METADATA is read off the set_forward_context
# call of the branch that calls the model. None (forward() then does nothing)
# while no hook is registered.

forward_info = (
    ForwardInfo(
        runs_ssu=batch_runs_mamba_ssu(
            ATTN_METADATA
            if ubatch_state is None
            else [c.attn_metadata for c in ubatch_state.forward_contexts]
        ),
        micro_batched=ubatch_state is not None,
        full_cudagraph=batch_desc.cg_mode == CUDAGraphMode.FULL,
    )
    if self.forward_hooks.active
    else None
)
