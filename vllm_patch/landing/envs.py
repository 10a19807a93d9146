# Lands in vllm/envs.py, shaped as that file is: each declaration is appended to its
# `if TYPE_CHECKING:` block, each definition to its `environment_variables` dict. Not
# added to ignored_factors, so both variables are part of the compile cache hash, like
# their neighbours.

if TYPE_CHECKING:
    VLLM_MAMBA_SR_SEED_PREFETCH: bool = False
    VLLM_MAMBA_SR_SEED_CHECK: bool = False

environment_variables: dict[str, Callable[[], Any]] = {
    # If set to 1, the FlashInfer and Triton Mamba SSU backends, and ReplaySSM
    # on either, draw a forward's stochastic-rounding seeds up front instead of
    # one torch.randint before every SSU call. The seeds are identical to
    # stock. No effect without --enable-mamba-cache-stochastic-rounding.
    "VLLM_MAMBA_SR_SEED_PREFETCH": lambda: bool(
        int(os.getenv("VLLM_MAMBA_SR_SEED_PREFETCH", "0"))
    ),
    # If set to 1 with VLLM_MAMBA_SR_SEED_PREFETCH, each eager forward checks
    # that nothing else draws from the CUDA generator between its seed draws
    # and its SSU calls (VLLM_MOE_ROUTING_SIMULATION_STRATEGY does), which
    # would make the seeds differ from stock's; it warns once if so.
    "VLLM_MAMBA_SR_SEED_CHECK": lambda: bool(
        int(os.getenv("VLLM_MAMBA_SR_SEED_CHECK", "0"))
    ),
}
