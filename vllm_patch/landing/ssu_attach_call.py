# Lands in ssu_dispatch.py's initialize_mamba_ssu_backend, right after its early return
# for KV cache configs without Mamba layers (both designs). USE_REPLAYSSM is the
# function's `use_replayssm` parameter where the release has one, else False.

_attach_sr_seed_prefetcher(
    mamba_config, kv_cache_config, replayssm=USE_REPLAYSSM
)
