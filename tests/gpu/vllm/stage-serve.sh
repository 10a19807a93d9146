#!/usr/bin/env bash
# Device side (H200 machine), from the repo root, after vLLM 0.26.0 is staged in /tmp/site
# (../shared/gpu/vllm-0.26/stage.sh 1 and 2), carry [".e2e/s3"]:
#   bash .e2e/s3/stage-serve.sh [DIR]     install into DIR (default $SR_SERVE_DEPS or
#                                         /tmp/serve-site) each wheel of .e2e/s3 whose
#                                         module does not import over /tmp/site, then
#                                         import what vllm serve and vllm bench serve load
#   source .e2e/s3/stage-serve.sh env     the environment of the 0.26.0 bundle's `env`
#                                         (for a call that does not carry .e2e/s2)
# Safe to run again: a wheel already importable is left alone.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ "${1:-}" = env ]; then
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} FLASHINFER_WORKSPACE_BASE=/tmp/fiws \
    VLLM_CACHE_ROOT=/tmp/vllm_cache TRITON_CACHE_DIR=/tmp/triton_cache \
    TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cache VLLM_ENABLE_V1_MULTIPROCESSING=0 \
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
  return 0 2>/dev/null || exit 0
fi
set -u
deps=${1:-${SR_SERVE_DEPS:-/tmp/serve-site}}
site=${SR_ENGINE_SITE:-/tmp/site}
[ -d "$site/vllm" ] || { echo "no vLLM in $site (SR_ENGINE_SITE): stage the 0.26.0 bundle first (stage.sh 1, 2)"; exit 1; }
mkdir -p "$deps"
module_of() {  # a wheel's import name
  case $(basename "$1" | cut -d- -f1) in
    attrs) echo attr ;; prometheus_fastapi_instrumentator) echo prometheus_fastapi_instrumentator ;;
    *) basename "$1" | cut -d- -f1 ;;
  esac
}
installed=(); failed=()
for wheel in "$here"/*.whl; do
  mod=$(module_of "$wheel")
  if PYTHONPATH=$site:$deps python3 -c "import $mod" 2>/dev/null; then continue; fi
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$deps" "$wheel" 2>&1 \
    | grep -v '^WARNING' || true
  if PYTHONPATH=$site:$deps python3 -c "import $mod" 2>/dev/null; then installed+=("$mod"); else failed+=("$mod"); fi
done
# Their bytecode once (the GPU machine sets PYTHONDONTWRITEBYTECODE=1): see engine.sh.
python3 -m compileall -q -j 0 "$deps" > /dev/null 2>&1 || true
echo "serve deps installed into $deps: ${installed[*]:-none (all imported already)}"
[ ${#failed[@]} = 0 ] || echo "could not install (vllm serve may still run without them): ${failed[*]}"
PYTHONPATH=$site:$deps VLLM_ENABLE_V1_MULTIPROCESSING=0 python3 -c "
import uvicorn, aiohttp, prometheus_client, prometheus_fastapi_instrumentator, transformers, tokenizers
import vllm.entrypoints.openai.api_server, vllm.entrypoints.serve.instrumentator.metrics
import vllm.benchmarks.serve
print('vllm serve and vllm bench serve import; transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"
