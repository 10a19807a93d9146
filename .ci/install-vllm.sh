#!/usr/bin/env bash
# Installs vLLM 0.33.0 for the CPU tests of vllm_patch (tests/vllm_patch/test_patched_vllm.py),
# with no GPU: vLLM's wheel without its dependencies (no CUDA torch, no kernels), torch 2.13.0
# (CPU), and the pure-Python packages that vllm.envs, ssu_dispatch, vllm.forward_context and
# both model runners import.  The wheel goes into sr-prefetch's cache, where the pristine tree
# the tests patch is built from it too, so it is downloaded once.  Last, .ci/install-checks.sh
# fetches what the checks against the releases' own files need.
#
# Usage: bash .ci/install-vllm.sh [PYTHON]    (default: python3; give the venv's python)
set -euo pipefail

PYTHON="${1:-python3}"
VERSION=0.33.0
WHEELS="${SR_PREFETCH_CACHE:-$HOME/.cache/sr-prefetch}/wheels"

mkdir -p "$WHEELS"
if ! compgen -G "$WHEELS/vllm-$VERSION-*.whl" >/dev/null; then
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        "vllm==$VERSION" --dest "$WHEELS"
fi

# xgrammar without its dependencies: they would pull in Triton (1 GB), which the CPU tests
# do not need (vLLM falls back to its Triton placeholders); its others are listed below.
# pip then warns that vLLM's CUDA requirements are missing: expected, they are left out.
"$PYTHON" -m pip install --quiet --no-deps "$WHEELS"/vllm-"$VERSION"-*.whl "xgrammar==0.2.8"

# The ranges and pins are vLLM 0.33.0's own requirements where it states them, but torch:
# 0.33.0 pins 2.14.0 (a CUDA build); its Python modules import with the CPU torch 2.13.0
# that the README's test command installs, and so do 0.26.0's (which pins 2.11.0), which
# test_patched_vllm.py imports over the same packages.
"$PYTHON" -m pip install --quiet \
    "torch==2.13.0" \
    "transformers>=5.16.1,<5.21.0" \
    "pydantic>=2.12.0" \
    "openai>=2.25.0" \
    "fastapi>=0.133.0,<0.137.0" \
    "aiohttp>=3.14.4" \
    "pyzmq>=25.0.0" \
    "prometheus_client>=0.18.0" \
    "pillow>=13.0.0" \
    "llguidance>=1.7.0,<1.8.0" \
    "apache-tvm-ffi==0.1.11" \
    openai-harmony partial-json-parser msgspec cbor2 pybase64 py-cpuinfo psutil tqdm regex \
    cachetools pyyaml einops cloudpickle blake3 requests uvloop numpy

"$PYTHON" -c "import vllm.v1.worker.gpu_model_runner, vllm.v1.worker.gpu.model_runner"
"$PYTHON" -c "import importlib.metadata as m; print('vLLM', m.version('vllm'), 'installed for the CPU tests')"

bash "$(dirname "$0")/install-checks.sh" "$PYTHON"
