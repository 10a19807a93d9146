# Lands in vllm/envs.py, shaped as that file is: each declaration is appended to its
# `if TYPE_CHECKING:` block, each definition to its `environment_variables` dict, and
# each name to compile_factors' `ignored_factors` set.

if TYPE_CHECKING:
    VLLM_MAMBA_SR_SEED_PREFETCH: bool = False

environment_variables: dict[str, Callable[[], Any]] = {
    # If set to 1, the FlashInfer and Triton Mamba SSU backends (ReplaySSM too)
    # draw a forward's stochastic-rounding seeds up front, identical to stock's
    # per-call torch.randint; only with --enable-mamba-cache-stochastic-rounding.
    "VLLM_MAMBA_SR_SEED_PREFETCH": lambda: bool(
        int(os.getenv("VLLM_MAMBA_SR_SEED_PREFETCH", "0"))
    ),
}

ignored_factors = {
    # Where the Mamba SR seeds are drawn, not their values; the SSU runs in an
    # opaque custom op, so no compiled graph changes with it.
    "VLLM_MAMBA_SR_SEED_PREFETCH",
}
