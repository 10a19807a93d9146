#!/usr/bin/env bash
# Device call 2 of the vLLM 0.20.0 identity run (tests/gpu/vllm/README.md), right after
# call 1 (`bash tests/gpu/vllm/stage-0.20.sh 1`, carry [".e2e020/s1"]) returns; carry
# [".e2e020/s2"]:
#   bash tests/gpu/vllm/identity-0.20.sh          stage 2, then the runs below
#   bash tests/gpu/vllm/identity-0.20.sh resume   the same runs, on where a cut-off call
#                                                 stopped (same warm machine, same code)
# Side by side on the one GPU, V1 only (0.20.0's V2 runner refuses hybrid models), each
# cut off after $T seconds (default 450):
#   fork      the fork's test per design on a copy of the site (first call only)
#   identity  stock, stock-again, the default (reset), the forward-context design
#             and the one-seed control ($ARMS), eager and FULL_AND_PIECEWISE
#   serving   stock, stock-again, the default and the one-seed control, FULL_AND_PIECEWISE,
#             in $SERVINGS (default seed-serving: MTP K=7 + async scheduling + prefix
#             caching in align mode)
# Everything under $OUT ends in $OUT/all.tar.xz.
set -u
if [ "${1:-}" != resume ]; then
  bash tests/gpu/vllm/stage-0.20.sh 2 || exit 1
fi
source tests/gpu/vllm/stage-0.20.sh env
out=${OUT:-/tmp/out}
mkdir -p "$out"
T=${T:-450}
ARMS=${ARMS:-reset,forward-context,control-one-seed}
echo "start $(date -u +%T)"
bash tests/gpu/vllm/engine.sh > "$out/prep.log" 2>&1 || { tail -20 "$out/prep.log"; exit 1; }
if [ "${1:-}" != resume ]; then
  (OUT=$out/fork timeout "$T" bash tests/gpu/vllm/engine.sh fork > "$out/fork.log" 2>&1) &
fi
(OUT=$out/serving SR_ENGINE_RESUME=/tmp/sr-engine/serving-0.20.0.json \
  SR_ENGINE_SERVING=${SERVINGS:-seed-serving} SR_ENGINE_MODES=FULL_AND_PIECEWISE \
  SR_ENGINE_IDENTITY_ARMS=reset,control-one-seed \
  timeout "$T" bash tests/gpu/vllm/engine.sh identity > "$out/serving.log" 2>&1) &
OUT=$out SR_ENGINE_IDENTITY_ARMS=$ARMS SR_ENGINE_MODES=eager,FULL_AND_PIECEWISE \
  timeout "$T" bash tests/gpu/vllm/engine.sh identity > "$out/identity.log" 2>&1
wait
for f in fork.log serving.log identity.log; do
  echo "== $f"; grep -E "passed|failed|error|Error" "$out/$f" 2>/dev/null | tail -4
done
grep -hE "PASSED|FAILED" "$out"/fork/*.log 2>/dev/null | tail -3
echo "end $(date -u +%T)"
# One file back: a device call brings back only a few.
cd "$out" && tar -cJf /tmp/all.tar.xz --exclude=all.tar.xz . && find . -mindepth 1 -delete \
  && mv /tmp/all.tar.xz "$out/" && ls -la "$out"
