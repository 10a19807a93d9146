# Lands beside set_forward_context in ModelCudaGraphManager.capture's forward_fn (the
# reset design): the warm-up, PIECEWISE and FULL capture forwards. Only the FULL
# capture runs inside torch.cuda.graph, so only its forward is recorded as capturing
# `desc`, whose replays sr_seed_replay(desc) draws for.

sr_seed_forward(
    ATTN_METADATA,
    captures=desc,
)
