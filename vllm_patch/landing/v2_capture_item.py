# Lands beside set_forward_context in ModelCudaGraphManager.capture's forward_fn (the
# reset design): the warm-up, PIECEWISE and FULL capture forwards. The base capture
# loop runs a FULL capture with cg_mode NONE, as it runs the warm-up, so the FULL
# capture is told by the descriptor and the warm-up flag of create_forward_fn.

sr_seed_forward(
    ATTN_METADATA,
    full_cudagraph=(
        desc.cg_mode == CUDAGraphMode.FULL and not warmup
    ),
)
