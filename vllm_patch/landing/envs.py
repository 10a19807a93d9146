# Lands in vllm/envs.py, shaped as that file is: each declaration is appended to its
# `if TYPE_CHECKING:` block, each definition to its `environment_variables` dict, and
# each name kept out of the compile cache hash to compile_factors' `ignored_factors`.

if TYPE_CHECKING:
    VLLM_MAMBA_SR_SEED_PREFETCH: bool = False

environment_variables: dict[str, Callable[[], Any]] = {
    # If set to 1, the FlashInfer and Triton Mamba SSU backends (ReplaySSM too)
    # draw a forward's stochastic-rounding seeds up front, identical to the
    # per-call torch.randint draws; only with
    # --enable-mamba-cache-stochastic-rounding.
    "VLLM_MAMBA_SR_SEED_PREFETCH": lambda: bool(
        int(os.getenv("VLLM_MAMBA_SR_SEED_PREFETCH", "0"))
    ),
}


def compile_factors() -> dict[str, object]:
    ignored_factors: set[str] = {
        # Decides at run time where the Mamba SSU's seeds are drawn, inside the
        # mamba_mixer2 custom op and the model runners: nothing torch.compile
        # traces, so toggling it keeps the compile cache.
        "VLLM_MAMBA_SR_SEED_PREFETCH",
    }
