# Lands in setup.py: appended to `package_data["vllm"]`, after the hf3fs JIT sources
# (targets/setup_py.py), so that a wheel built from the tree carries the CUDA source
# that the seed op is compiled from.

# Mamba SSU seed kernel, JIT-compiled on first use
"model_executor/layers/mamba/ops/sr_seed_prefetch/csrc/*.cu",
