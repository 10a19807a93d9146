# Lands in ssu_dispatch.py after `_mamba_ssu_backend`: the reset design's module state.


# Hands the SSU calls their pre-drawn seeds (VLLM_MAMBA_SR_SEED_PREFETCH).
_sr_seed_prefetcher: SRSeedPrefetcher | None = None
# The Mamba-2 layer whose attention metadata tells whether a forward runs the SSU.
_mamba2_probe_layer: str | None = None
_NO_SR_SEED_FORWARD = nullcontext()
