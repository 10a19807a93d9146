#!/usr/bin/env bash
# The patched vLLM engine on the GPU machine: the fork's test, identity to stock, decode
# step time.  From the repo root, after a vLLM release is staged into a site-packages
# folder, SR_ENGINE_SITE (default /tmp/site: vLLM 0.26.0, staged as the shared GPU notes
# say; /tmp/site-0.20.0 for vLLM 0.20.0: tests/gpu/vllm/README.md), with its
# environment exported:
#   bash tests/gpu/vllm/engine.sh fork identity timing pack
# Each step is optional and runs in the order given (with none, the script only makes
# the patched copies: run it so first when two invocations run side by side, e.g.
# `fork` in the background beside `identity`):
#   fork      tests/gpu/vllm/patched_installed.sh on a copy of the site (apply --installed,
#             the fork's test per design, revert byte for byte)
#   identity  tests/gpu/vllm/test_engine_identity.py (every arm x runner x graph mode x
#             serving configuration of SR_ENGINE_SERVING: plain when unset)
#   timing    bench/engine/test_engine_step.py (pytest-benchmark, interleaved rounds): decode
#             steps, MTP verify iterations (SR_ENGINE_TIMING_SERVING=mtp7) or mixed
#             prefill/decode steps (SR_ENGINE_WORKLOAD=mixed)
#   reproduce bench/engine/reproduce.py: does stock compute the same bits in two
#             processes, per setting (a diagnostic of the compiled modes)
#   serve     bench/serve/run.py: per runner and round one `vllm serve` per arm (the seed
#             document's flags), all up together, the identity requests over HTTP, vLLM's
#             own `vllm bench serve` per shape in blocks rotated over the arms' servers,
#             the engagement lines (SR_SERVE_*: python -m bench.serve.envs; the serve deps
#             staged by tests/gpu/vllm/stage-serve.sh); resumes after a cut from
#             /tmp/sr-engine/serve-<stamp>.json; SR_SERVE_TIMEOUT (s) bounds the step
#   paired    bench/serve/paired.py: two resident servers pinned to cores of their own,
#             requests in A B B A pairs, each run into $OUT/engine/paired/; its options
#             from SR_SERVE_PAIRED_ARGS (default: an A/A run pair of stock servers, plain decode)
#   pack      everything but the result JSONs into $OUT/engine-run.tar.xz (a device
#             call brings back only a few files, none deep), and Triton's autotuning picks
#             and FlashInfer's JIT builds into $OUT/triton-picks.tar.xz and
#             $OUT/flashinfer-builds.tar.xz (bench/engine/carried_caches.py); run it last,
#             also after a step cut off by `timeout`
# An identity run cut off by a time limit goes on where it stopped when run again on the
# same machine with the same code and vLLM (its records are kept in /tmp/sr-engine, under
# a stamp of vllm_patch/, runner_hooks/, bench/engine/, the bench variants it attaches and the site's vLLM version).
# The patched copies ($SR_ENGINE_SITE-reset, $SR_ENGINE_SITE-forward-context) are
# hard-linked copies of the site (the patch replaces files, it never writes through a
# link), made again when that stamp changes; neither needs a build step.
# With two GPUs, V1 engines run on the first and V2 engines on the second.  With
# SR_ENGINE_TP=N (1, 2, 4, 8; default 1) every engine runs over N GPUs, one process per
# rank: V1 on the first N, V2 on the next N where there are 2N, else on the same N.
# Results go to $OUT/engine (default /tmp/out/engine).
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out/engine"
site=${SR_ENGINE_SITE:-/tmp/site}
dist=$(cd "$site" 2>/dev/null && ls -d vllm-*.dist-info 2>/dev/null)
[ -n "$dist" ] || { echo "no vLLM installed in $site (SR_ENGINE_SITE): stage one first"; exit 1; }
stamp=$( (find vllm_patch runner_hooks bench/engine bench/variants.py bench/drawers.py bench/sync.py -type f ! -path '*__pycache__*' | sort \
  | xargs cat; echo "$dist") | sha256sum | cut -c1-12)
export OUT=$out TORCH_EXTENSIONS_DIR=/tmp/torch_ext
tp=${SR_ENGINE_TP:-1}
# Records of TP 1 keep the name they had before TP was a setting; a preset SR_ENGINE_RESUME
# (a second identity run beside the first, with its own OUT) is kept.
export SR_ENGINE_RESUME=${SR_ENGINE_RESUME:-/tmp/sr-engine/identity-$stamp$([ "$tp" = 1 ] || echo "-tp$tp").json}
export SR_ENGINE_SITES="stock=$site,reset=$site-reset,forward-context=$site-forward-context"
export SR_ENGINE_GPUS=${SR_ENGINE_GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader \
  | head -n $((2 * tp)) | paste -sd, -)}
status=0
# The GPU machine sets PYTHONDONTWRITEBYTECODE=1 and the staging installs with --no-compile,
# so every process compiled vLLM's modules again (24-27 s to import the API server, 19-20 s
# with .pyc files: bench/results/serve-nvidia-h200-20261205-starts.md). The site's bytecode
# is written once, before the copies link to it; a patched file's .pyc no longer matches its
# source, and Python compiles that file alone.
if [ ! -e "$site.compiled" ]; then
  python3 -m compileall -q -j 0 "$site" > /dev/null 2>&1; touch "$site.compiled"
fi
for design in reset forward-context; do
  copy=$site-$design
  if [ "$(cat "$copy.patched" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$copy" "$copy.patched" && cp -al "$site" "$copy" \
      && python3 -m vllm_patch apply "$copy" --design "$design" \
      && echo "$stamp" > "$copy.patched" || { echo "could not patch $copy"; exit 1; }
  fi
done
# What an earlier machine's engines tuned and built, where a call carried it
# (bench/engine/carried_caches.py; SR_TRITON_PICKS and SR_FLASHINFER_BUILDS, default
# .e2e/triton-picks.tar.xz and .e2e/flashinfer-builds.tar.xz, from `pack`): a fresh
# machine's first engine or server then skips the Mamba-2 SSD kernels' autotuning (81 s)
# and each copy's JIT build of FlashInfer's SSU module (~30 s).
python3 -m bench.engine.carried_caches restore "$site" "$site-reset" "$site-forward-context" \
  --compute-cap "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1)" \
  || echo "(not restored: the engines tune and build as on a fresh machine)"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$out/engine/gpus.txt"
for step in "$@"; do
  echo "=== $step $(date -u +%T)"
  case $step in
    fork)
      rm -rf "$site-fork" && cp -al "$site" "$site-fork"
      PYTHONPATH=$PWD:$site-fork bash tests/gpu/vllm/patched_installed.sh || status=1 ;;
    identity)
      python3 -m pytest tests/gpu/vllm/test_engine_identity.py -v -p no:cacheprovider \
        2>&1 | tee "$out/engine/identity-pytest.log"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    timing)
      # The files' tag, as timing.Plan.tag names timing.json's: none for plain decode steps.
      tag=$([ "${SR_ENGINE_TIMING_SERVING:-plain}" = plain ] || echo "-$SR_ENGINE_TIMING_SERVING")
      tag=$tag$([ "${SR_ENGINE_WORKLOAD:-decode}" = decode ] || echo "-$SR_ENGINE_WORKLOAD")
      python3 -m pytest bench/engine/test_engine_step.py --benchmark-only -v \
        -p no:cacheprovider --benchmark-json="$out/engine/benchmark$tag.json" \
        2>&1 | tee "$out/engine/timing$tag-pytest.log"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    reproduce)
      python3 -m bench.engine.reproduce 2>&1 | tee "$out/engine/reproduce.log"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    pack)
      (cd "$out" && find . -type f ! -name engine-run.tar.xz ! -path ./engine/identity.json \
         ! -path './engine/timing*.json' ! -path './engine/benchmark*.json' \
         ! -path ./engine/reproduce.json ! -path ./engine/reproduce-code.tar.xz \
         ! -path ./engine/serve.json ! -path './engine/paired/*.jsonl' ! -name triton-picks.tar.xz ! -name flashinfer-builds.tar.xz \
         -print0 | tar --null -T - -cJf engine-run.tar.xz --remove-files) || status=1
      python3 -m bench.engine.carried_caches pack "$out" || status=1 ;;
    serve)
      serve_stamp=$( (echo "$stamp"; find bench/serve -type f -name '*.py' ! -name 'test_*' | sort | xargs cat) \
        | sha256sum | cut -c1-12)
      export SR_SERVE_RESUME=${SR_SERVE_RESUME:-/tmp/sr-engine/serve-$serve_stamp.json}
      mkdir -p "$(dirname "$SR_SERVE_RESUME")"
      PYTHONPATH=$PWD:$site:${SR_SERVE_DEPS:-/tmp/serve-site}${PYTHONPATH:+:$PYTHONPATH} \
        timeout -k 30 "${SR_SERVE_TIMEOUT:-86400}" python3 -m bench.serve.run 2>&1 | tee -a "$out/engine/serve.log"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    paired)
      PYTHONPATH=$PWD:$site:${SR_SERVE_DEPS:-/tmp/serve-site}${PYTHONPATH:+:$PYTHONPATH} \
        python3 -m bench.serve.paired run ${SR_SERVE_PAIRED_ARGS:---a stock --b stock --runs 2} \
        --out "$out/engine/paired" 2>&1 | tee -a "$out/engine/paired.log"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    *) echo "unknown step $step (fork, identity, timing, reproduce, serve, paired, pack)"; exit 2 ;;
  esac
done
echo "=== done $(date -u +%T), exit status $status"
exit $status
