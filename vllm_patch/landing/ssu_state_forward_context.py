# Lands in ssu_dispatch.py after `_mamba_ssu_backend`: the forward-context design's
# module state.


# Hands FlashInferSSUBackend its pre-drawn stochastic-rounding seeds; attached
# by initialize_mamba_ssu_backend where VLLM_MAMBA_SR_SEED_PREFETCH applies.
_sr_seed_prefetcher: ForwardContextSeedPrefetcher | None = None
