# Lands in both model runners' __init__ (the reset design), after the statement the
# runner's table names: the runner owns its ForwardHooks, the seed relay registered.


# While a hook is registered, each forward that draws its Mamba SSU seeds
# up front runs inside self.forward_hooks.forward(): the seed prefetcher
# learns from it where the forward begins and ends.
self.forward_hooks = ForwardHooks()
register_mamba_sr_seed_hook(self.forward_hooks)
