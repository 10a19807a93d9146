# Lands beside the V2 runner's `set_forward_context(...)` in execute_model (the reset
# design), as another context manager of the same `with`: the PIECEWISE, eager and DBO
# forwards (a FULL graph is replayed in the branch before, after sr_seed_replay).
# ATTN_METADATA is read off that call; a DBO forward (`ubatch_state`, 0.30.0 on) draws
# its seeds inline.

sr_seed_forward(ATTN_METADATA, micro_batched=MICRO_BATCHED)
