#!/usr/bin/env bash
# Device side (the H200 machine), from the repo root: installs the vLLM 0.20.0 bundle of
# tests/gpu/vllm/bundle-0.20.sh into /tmp/site-0.20.0, in two calls, the second right after
# the first returns (/tmp does not outlive the machine):
#   call 1, carry [".e2e020/s1"]:  bash tests/gpu/vllm/stage-0.20.sh 1
#   call 2, carry [".e2e020/s2"]:  bash tests/gpu/vllm/stage-0.20.sh 2   (identity-0.20.sh does it)
# `source tests/gpu/vllm/stage-0.20.sh env` exports what an in-process engine run needs,
# SR_ENGINE_SITE (tests/gpu/vllm/engine.sh's stock copy) among them.
set -u
SITE=/tmp/site-0.20.0
STAGE=/tmp/stage-0.20.0
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$@" 2>&1 \
  | grep -v '^WARNING' || true; }
unxz_to() { python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.decompress(open(sys.argv[1],'rb').read()))" "$1" "$2"; }
case "${1:-}" in
1)
  # vLLM 0.20.0's wheel is manylinux_2_35; its compiled ops are built for torch 2.11.0.
  python3 - <<'EOF' || exit 1
import os, sys, torch
glibc = tuple(int(p) for p in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
if glibc < (2, 35):
    sys.exit(f"vLLM 0.20.0's wheel needs glibc 2.35; this machine has {glibc}")
if not torch.__version__.startswith("2.11.0"):
    sys.exit(f"vLLM 0.20.0's ops are built for torch 2.11.0; this machine has {torch.__version__}")
EOF
  [ -f .e2e020/s1/c.so.xz ] || { echo "no .e2e020/s1: carry it (tests/gpu/vllm/bundle-0.20.sh builds it)"; exit 1; }
  rm -rf "$SITE" "$STAGE"; mkdir -p "$SITE" "$STAGE"
  unxz_to .e2e020/s1/c.so.xz "$STAGE/_C.abi3.so"
  unxz_to .e2e020/s1/fa3.so.xz "$STAGE/_vllm_fa3_C.abi3.so"
  pipi .e2e020/s1/*.whl
  echo "stage 1 done" ;;
2)
  [ -f "$STAGE/_C.abi3.so" ] || { echo "stage 1 is gone (the machine was given back): run call 1 again"; exit 1; }
  [ -d .e2e020/s2 ] || { echo "no .e2e020/s2: carry it"; exit 1; }
  pipi .e2e020/s2/*.whl
  cp "$STAGE/_C.abi3.so" "$SITE/vllm/"
  cp "$STAGE/_vllm_fa3_C.abi3.so" "$SITE/vllm/vllm_flash_attn/"
  # The import of both runners and the model, both structured-output backends' native
  # libraries (vllm.v1.structured_output loads them at import), and one of _C's kernels
  # against torch's result: the fatbin of _C keeps sm_90 device code only (bundle.py), so
  # a kernel that would not load on this GPU fails here rather than in an engine.
  PYTHONPATH=$SITE VLLM_ENABLE_V1_MULTIPROCESSING=0 python3 - <<'EOF' || exit 1
import torch
import llguidance, xgrammar
import vllm, flashinfer.mamba, vllm.v1.worker.gpu_model_runner, vllm.v1.worker.gpu.model_runner
import vllm.model_executor.models.nemotron_h, vllm.vllm_flash_attn, vllm.v1.structured_output
xgrammar.Grammar.builtin_json_grammar(), llguidance.LLMatcher  # their native libraries
from vllm import _custom_ops as ops
x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
out = torch.empty_like(x)
ops.rms_norm(out, x, w, 1e-6)
ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
print("vLLM", vllm.__version__, "ready in /tmp/site-0.20.0 (torch", torch.__version__ + ")")
EOF
  ;;
env)
  export SR_ENGINE_SITE=$SITE PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} \
    FLASHINFER_WORKSPACE_BASE=/tmp/fiws VLLM_CACHE_ROOT=/tmp/vllm_cache \
    TRITON_CACHE_DIR=/tmp/triton_cache TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cache \
    TORCH_EXTENSIONS_DIR=/tmp/torch_ext VLLM_ENABLE_V1_MULTIPROCESSING=0 \
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 ;;
*) echo "usage: stage-0.20.sh 1|2|env"; exit 2 ;;
esac
