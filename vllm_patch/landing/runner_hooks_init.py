# Lands in both model runners' __init__ (the reset design), after the statement the
# runner's table names: the runner owns its ForwardHooks, the seed relay registered.


# Told where each forward begins and ends (the Mamba SR seed prefetcher).
self.forward_hooks = sr_seed_prefetch.ForwardHooks()
register_mamba_sr_seed_hook(self.forward_hooks)
