"""`python -m vllm_patch`: the sr-prefetch command line."""

from .cli import entry

entry()
