# Lands beside a V1 model runner's `set_forward_context(...)` (the reset design), as
# another context manager of the same `with`. ATTN_METADATA, UBATCH_SLICES and
# CUDAGRAPH_MODE are read off that set_forward_context call, so the seed prefetcher
# sees the forward it opens; a FULL forward captures or replays a graph inside it.

sr_seed_forward(
    ATTN_METADATA,
    micro_batched=UBATCH_SLICES is not None,
    full_cudagraph=CUDAGRAPH_MODE == CUDAGraphMode.FULL,
)
