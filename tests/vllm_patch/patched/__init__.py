"""Tests that import a patched vLLM tree; test_patched_vllm.py runs them in a subprocess."""
