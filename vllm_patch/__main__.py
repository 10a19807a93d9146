"""`python -m vllm_patch`: the sr-prefetch command line."""

from . import entry

entry()
