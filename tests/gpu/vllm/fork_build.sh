#!/usr/bin/env bash
# The seed op as a vLLM fork's own build makes it, on the GPU machine: vLLM's CMake
# preamble (its torch, CUDA-arch and compiler-flag setup), its cmake/utils.cmake, and
# the patch's _mamba_sr_C block, in .fork/ (made here from the patched tree:
# tests/gpu/vllm/README.md, "The fork's build"); then the op's identity tests against
# the library built that way (SR_FORK_OP_LIBRARY, tests/gpu/test_fork_op.py).
#   carry [".fork"]:  bash tests/gpu/vllm/fork_build.sh
set -euo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
cmake -G Ninja -S .fork -B /tmp/fork-build -DVLLM_TARGET_DEVICE=cuda \
  -DVLLM_PYTHON_EXECUTABLE="$(command -v python3)" 2>&1 | tee "$out/fork-configure.log" | tail -5
cmake --build /tmp/fork-build --target _mamba_sr_C 2>&1 | tee "$out/fork-build.log" | tail -5
library=$(ls /tmp/fork-build/_mamba_sr_C*.so)
echo "built $library"
SR_FORK_OP_LIBRARY=$library PYTHONPATH=$PWD python3 -m pytest -ra -v -p no:cacheprovider \
  tests/gpu/test_fork_op.py 2>&1 | tee "$out/fork-op-pytest.log"
