# Lands in vllm/envs.py, shaped as that file is: each declaration is appended to its
# `if TYPE_CHECKING:` block, each definition to its `environment_variables` dict. Not
# added to ignored_factors, so the variable is part of the compile cache hash, like its
# neighbours.

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
