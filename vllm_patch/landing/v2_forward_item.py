# Lands beside the V2 runner's `set_forward_context(...)` in execute_model (the reset
# design), as another context manager of the same `with`: the PIECEWISE and eager
# forwards (a FULL graph is replayed in the branch before, with no Python forward
# and nothing for the hooks to do). ATTN_METADATA is read off that call. With no
# hook registered (the flag unset), nothing is built.

self.forward_hooks.forward(
    sr_seed_prefetch.ForwardInfo(
        runs_ssu=batch_runs_mamba_ssu(ATTN_METADATA)
    )
    if self.forward_hooks.active
    else None
)
