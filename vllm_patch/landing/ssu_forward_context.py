# Lands in ssu_dispatch.py after the gate (ssu_gate.py): the forward-context design's
# attach, and how its prefetcher sees forwards and micro-batches.


def _attach_sr_seed_prefetcher(
    mamba_config: MambaConfig, kv_cache_config: KVCacheConfig, replayssm: bool
) -> None:
    """Attaches a seed prefetcher where it applies, replacing the previous
    one: this runs for each KV cache config (profiling, then the real one)."""
    global _sr_seed_prefetcher
    layers = _mamba_layer_names(kv_cache_config, MAMBA2_TYPE)
    _sr_seed_prefetcher = None
    if not envs.VLLM_MAMBA_SR_SEED_PREFETCH:
        return
    blocker = _sr_seed_prefetch_blocker(mamba_config, kv_cache_config)
    if blocker is not None:
        logger.info_once("VLLM_MAMBA_SR_SEED_PREFETCH is set but unused: %s.", blocker)
        return
    num_layers = len(layers)
    _sr_seed_prefetcher = ForwardContextSeedPrefetcher(
        num_layers,
        "cuda",
        current_forward=_current_forward_context,
        is_micro_batched=_in_micro_batch,
    )
    inactive = _sr_seed_prefetcher.inactive_reason
    (logger.info_once if inactive is None else logger.warning_once)(
        "Prefetching Mamba stochastic-rounding seeds for %d layers per forward "
        "(forward-context design, %s %s%s).",
        num_layers,
        mamba_config.backend.value,
        "ReplaySSM" if replayssm else "SSU",
        "" if inactive is None else f", inactive: {inactive}",
    )


def _current_forward_context() -> ForwardContext | None:
    """The forward context being run, which tells one forward from the next."""
    return get_forward_context() if is_forward_context_available() else None


def _in_micro_batch(forward_context: object) -> bool:
    """Whether the SSU runs in a DBO micro-batch. Each micro-batch runs on its
    own thread under its own forward context, which carries no mark of it;
    the ubatching module knows while micro-batch threads run."""
    return dbo_enabled()
