# Lands in both model runners' __init__ (the reset design), after the statement the
# runner's table names: the runner owns its ForwardHooks, the seed relay registered.


# Every forward of the target model runs inside
# self.forward_hooks.forward() while a hook is registered; the Mamba SSU
# seed prefetcher learns from it where each forward begins and ends.
self.forward_hooks = ForwardHooks()
register_mamba_sr_seed_hook(self.forward_hooks)
