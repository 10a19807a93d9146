# Lands in ssu_dispatch.py before get_mamba_ssu_backend (both designs), followed by
# the design's _attach_sr_seed_prefetcher. prefetched_sr_seed is what both SSU
# backends and both ReplaySSM calls ask: FlashInfer's two calls through
# sr_rand_seed, which draws when it is None; the Triton backend, and
# mamba_mixer2.py's Triton ReplaySSM call, hand it to their kernel's wrapper,
# which draws when it is None. MAMBA1_TYPE and MAMBA2_TYPE are how the release
# names the Mamba types: read off initialize_mamba_ssu_backend's own check (an
# enum from 0.21.0 on, the strings "mamba1" / "mamba2" before).


# vLLM loads a speculative draft model's layers under this prefix
# (vllm/v1/spec_decode/draft_model.py). They share the KV cache config, but they
# run in the proposer's own forwards, which take no prefetched seed.
_DRAFT_MODEL_PREFIX = "draft_model."


def _mamba_layer_names(kv_cache_config: KVCacheConfig, mamba_type: object) -> list[str]:
    """This rank's layers of `mamba_type` in the target model; of Mamba-2, N: a
    model runner's forward's SSU calls."""
    return [
        layer_name
        for group in kv_cache_config.kv_cache_groups
        if isinstance(group.kv_cache_spec, MambaSpec)
        and group.kv_cache_spec.mamba_type == mamba_type
        for layer_name in group.layer_names
        if not layer_name.startswith(_DRAFT_MODEL_PREFIX)
    ]


def _sr_seed_prefetch_blocker(
    mamba_config: MambaConfig, kv_cache_config: KVCacheConfig
) -> str | None:
    """Why VLLM_MAMBA_SR_SEED_PREFETCH, set, cannot apply here; None if it can."""
    if not mamba_config.enable_stochastic_rounding:
        return "stochastic rounding is off"
    if envs.VLLM_MOE_ROUTING_SIMULATION_STRATEGY:
        # It draws from the CUDA generator between Mamba layers.
        return "VLLM_MOE_ROUTING_SIMULATION_STRATEGY is set"
    if mamba_config.backend not in (
        MambaBackendEnum.FLASHINFER,
        MambaBackendEnum.TRITON,
    ):
        return f"the Mamba SSU backend is {mamba_config.backend.value}"
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return "the platform is not CUDA"
    if _mamba_layer_names(kv_cache_config, MAMBA1_TYPE):
        # Mamba-1 layers call the same SSU, but N counts Mamba-2 layers only.
        return "the model has Mamba-1 layers"
    if not _mamba_layer_names(kv_cache_config, MAMBA2_TYPE):
        return "the model has no Mamba-2 layers"
    return None


def prefetched_sr_seed() -> torch.Tensor | None:
    """This SSU call's prefetched seed, or None: the caller draws its own."""
    return None if _sr_seed_prefetcher is None else _sr_seed_prefetcher.next_seed()


def sr_rand_seed(device: torch.device) -> torch.Tensor:
    """This SSU call's seed: the prefetched one, else drawn here, as without
    prefetching."""
    seed = prefetched_sr_seed()
    if seed is not None:
        return seed
    return torch.randint(0, 2**32, (1,), device=device)
