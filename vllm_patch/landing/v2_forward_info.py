# Lands in the V2 runner's execute_model (the reset design), before the branch that
# replays a FULL graph or calls the model: what the forward hooks are told of this
# forward, either way. ATTN_METADATA and MICRO_BATCHED are read off the
# set_forward_context call of the branch that calls the model. None (forward() then
# does nothing) while no hook is registered.

forward_info = (
    ForwardInfo(
        runs_ssu=batch_runs_mamba_ssu(ATTN_METADATA),
        micro_batched=MICRO_BATCHED,
        full_cudagraph=batch_desc.cg_mode == CUDAGraphMode.FULL,
    )
    if self.forward_hooks.active
    else None
)
