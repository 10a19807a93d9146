# Lands in ssu_dispatch.py after the gate (ssu_gate.py): the reset design's attach, and
# what its model runners call around each forward.


def _attach_sr_seed_prefetcher(
    mamba_config: MambaConfig, kv_cache_config: KVCacheConfig, replayssm: bool
) -> None:
    """Attaches a seed prefetcher where it applies. This runs for each KV cache
    config (profiling, then the real one); one already attached for as many
    layers stays, with the buffer its captured graphs read."""
    global _sr_seed_prefetcher, _mamba2_probe_layer
    layers = _mamba_layer_names(kv_cache_config, MAMBA2_TYPE)
    _mamba2_probe_layer = layers[0] if layers else None
    attached = _sr_seed_prefetcher
    _sr_seed_prefetcher = None
    if not envs.VLLM_MAMBA_SR_SEED_PREFETCH:
        return
    from vllm.triton_utils import HAS_TRITON

    blocker = _sr_seed_prefetch_blocker(mamba_config, kv_cache_config)
    if blocker is None and not HAS_TRITON:
        blocker = "Triton, which draws the seeds, is not installed"
    if blocker is not None:
        logger.info_once("VLLM_MAMBA_SR_SEED_PREFETCH is set but unused: %s.", blocker)
        return
    if attached is not None and attached.prefetch.num_seeds == len(layers):
        _sr_seed_prefetcher = attached
        return
    device = torch.device("cuda", torch.accelerator.current_device_index())
    _sr_seed_prefetcher = SRSeedPrefetcher(
        SeedPrefetch("Mamba SR seed prefetch", len(layers), device, fill_randint_seeds)
    )
    logger.info_once(
        "Prefetching Mamba stochastic-rounding seeds for %d layers per forward "
        "(%s %s).",
        len(layers),
        mamba_config.backend.value,
        "ReplaySSM" if replayssm else "SSU",
    )


def sr_seed_forward(
    attn_metadata: dict[str, Any] | list[Any] | None,
    *,
    micro_batched: bool = False,
    full_cudagraph: bool = False,
    captures: object = None,
) -> AbstractContextManager[None]:
    """What a model runner wraps each model forward in: where a seed prefetcher
    is attached and the forward runs the SSU, not micro-batched, its seeds are
    drawn as it begins and its SSU calls take them; else nothing.
    `full_cudagraph`: the forward captures or replays a FULL CUDA graph;
    `captures`: the key of the FULL graph it captures, for sr_seed_replay."""
    if (
        _sr_seed_prefetcher is None
        or micro_batched
        or not _batch_runs_mamba_ssu(attn_metadata)
    ):
        return _NO_SR_SEED_FORWARD
    return _sr_seed_prefetcher.forward(full_cudagraph, captures)


def sr_seed_replay(graph: object) -> None:
    """What a model runner calls before replaying the FULL CUDA graph it captured
    as `graph` with no forward around it: draws the seeds the graph reads."""
    if _sr_seed_prefetcher is not None:
        _sr_seed_prefetcher.replay(graph)


def _batch_runs_mamba_ssu(attn_metadata: dict[str, Any] | list[Any] | None) -> bool:
    """Whether a forward with this attention metadata calls the Mamba SSU:
    MambaMixer2 does only for decode tokens, and one Mamba-2 layer's metadata
    tells for all. Micro-batched metadata (a list) says no: the prefetcher
    leaves such forwards to the inline draw."""
    if _mamba2_probe_layer is None or not isinstance(attn_metadata, dict):
        return False
    metadata = attn_metadata.get(_mamba2_probe_layer)
    return metadata is not None and metadata.num_decodes > 0
