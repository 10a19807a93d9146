"""sr-prefetch: applies the Mamba stochastic-rounding seed prefetch to a vLLM v0.33.0 tree.

`cli` is the command line; `edits` says what changes in vLLM per design,
`vendor` produces the vLLM-side copy of runner_hooks, `fork_test` the test
file the fork gets, `patch` applies and reverts, and `tree` finds trees,
their versions, and the pristine v0.33.0 tree in the cache.
"""
