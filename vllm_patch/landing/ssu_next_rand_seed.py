# Lands in ssu_dispatch.py as the last method of FlashInferSSUBackend (both designs);
# FlashInferSSUBackend.__call__ calls it where stock calls torch.randint.


def _next_rand_seed(self, device: torch.device) -> torch.Tensor:
    """This call's stochastic-rounding seed: the prefetched one when a
    prefetcher is attached and has it, else drawn inline exactly as stock
    (outside a forward, beyond the forward's N calls, ...)."""
    seed = _prefetched_sr_seed()
    if seed is not None:
        return seed
    return torch.randint(0, 2**32, (1,), device=device)
