# Lands beside a model runner's `set_forward_context(...)` (the reset design), as
# another context manager of the same `with`. ATTN_METADATA, UBATCH_SLICES and
# CUDAGRAPH_MODE are read off that set_forward_context call, so the hooks see the
# forward it opens. With no hook registered (the flag unset), nothing is built.

self.forward_hooks.forward(
    sr_seed_prefetch.ForwardInfo(
        runs_ssu=batch_runs_mamba_ssu(ATTN_METADATA),
        micro_batched=UBATCH_SLICES is not None,
        full_cudagraph=CUDAGRAPH_MODE == CUDAGraphMode.FULL,
    )
    if self.forward_hooks.active
    else None
)
