# Lands in vllm/_custom_ops.py (the reset design, every target), after
# `def selective_scan_fwd` (targets/custom_ops.py): the seed op of the _mamba_sr_C
# extension, beside the other Mamba ops' wrappers.


def mamba_sr_stock_seeds(out: torch.Tensor) -> None:
    """Fills `out` (int64, CUDA) with the values of len(out) consecutive
    torch.randint(0, 2**32, (1,)) draws, advancing the CUDA generator as
    they would; one kernel launch."""
    torch.ops._mamba_sr_C.stock_seeds(out)
