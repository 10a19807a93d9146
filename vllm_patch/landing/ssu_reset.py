# Lands in ssu_dispatch.py after the gate (ssu_gate.py): the reset design's attach, the
# relay its model runners register, and how they tell whether a batch runs the SSU.


def _attach_sr_seed_prefetcher(
    mamba_config: MambaConfig, kv_cache_config: KVCacheConfig, replayssm: bool
) -> None:
    """Attaches a seed prefetcher where it applies, replacing the previous
    one: this runs for each KV cache config (profiling, then the real one)."""
    global _sr_seed_prefetcher, _mamba2_probe_layer
    layers = _mamba_layer_names(kv_cache_config, MAMBA2_TYPE)
    _mamba2_probe_layer = layers[0] if layers else None
    _sr_seed_prefetcher = None
    if not envs.VLLM_MAMBA_SR_SEED_PREFETCH:
        return
    blocker = _sr_seed_prefetch_blocker(mamba_config, kv_cache_config)
    if blocker is not None:
        logger.info_once("VLLM_MAMBA_SR_SEED_PREFETCH is set but unused: %s.", blocker)
        return
    _sr_seed_prefetcher = SRSeedPrefetcher(len(layers), "cuda")
    inactive = _sr_seed_prefetcher.inactive_reason
    (logger.info_once if inactive is None else logger.warning_once)(
        "Prefetching Mamba stochastic-rounding seeds for %d layers per forward "
        "(explicit-reset design, %s %s%s).",
        len(layers),
        mamba_config.backend.value,
        "ReplaySSM" if replayssm else "SSU",
        "" if inactive is None else f", inactive: {inactive}",
    )


def register_mamba_sr_seed_hook(hooks: ForwardHooks) -> None:
    """Registers the seed relay on a model runner's hooks if
    VLLM_MAMBA_SR_SEED_PREFETCH is set (unset, its forwards run no hook)."""
    if envs.VLLM_MAMBA_SR_SEED_PREFETCH:
        hooks.register(MambaSRSeedHook())


class MambaSRSeedHook:
    """Relays a model runner's forwards to the seed prefetcher attached now."""

    def on_forward_begin(self, info: ForwardInfo) -> None:
        if _sr_seed_prefetcher is not None:
            _sr_seed_prefetcher.on_forward_begin(info)

    def on_forward_end(self, info: ForwardInfo) -> None:
        if _sr_seed_prefetcher is not None:
            _sr_seed_prefetcher.on_forward_end(info)


def batch_runs_mamba_ssu(attn_metadata: dict[str, Any] | list[Any] | None) -> bool:
    """Whether a forward with this attention metadata (a list: one per
    micro-batch) calls the Mamba SSU: MambaMixer2 does only for decode tokens,
    and one Mamba-2 layer's metadata tells for all."""
    if _mamba2_probe_layer is None or attn_metadata is None:
        return False
    per_ubatch = attn_metadata if isinstance(attn_metadata, list) else [attn_metadata]
    return any(
        (metadata := per_layer.get(_mamba2_probe_layer)) is not None
        and metadata.num_decodes > 0
        for per_layer in per_ubatch
    )
