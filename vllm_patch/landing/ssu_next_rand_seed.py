# Lands in ssu_dispatch.py as the last method of FlashInferSSUBackend (both designs);
# FlashInferSSUBackend.__call__ calls it where stock calls torch.randint.


def _next_rand_seed(self, device: torch.device) -> torch.Tensor:
    """This call's seed: the prefetched one, else drawn inline as stock."""
    seed = prefetched_sr_seed()
    if seed is not None:
        return seed
    return torch.randint(0, 2**32, (1,), device=device)
