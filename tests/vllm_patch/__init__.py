"""Tests of vllm_patch, the sr-prefetch command line."""
