# Lands beside the V2 runner's `set_forward_context(...)` in execute_model (the reset
# design) where it runs DBO micro-batches (`ubatch_state`, 0.30.0 on), as another
# context manager of the same `with`: the PIECEWISE, eager and DBO forwards (a FULL
# graph is replayed in the branch before, with no Python forward and nothing for the
# hooks to do). A micro-batched forward's attention metadata is per micro-batch, in
# ubatch_state's forward contexts. ATTN_METADATA is read off the set_forward_context
# call. With no hook registered (the flag unset), nothing is built.

self.forward_hooks.forward(
    sr_seed_prefetch.ForwardInfo(
        runs_ssu=batch_runs_mamba_ssu(
            [c.attn_metadata for c in ubatch_state.forward_contexts]
            if ubatch_state is not None
            else ATTN_METADATA
        ),
        micro_batched=ubatch_state is not None,
    )
    if self.forward_hooks.active
    else None
)
