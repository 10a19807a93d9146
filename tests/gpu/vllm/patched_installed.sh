#!/usr/bin/env bash
# On the H200 machine, with a pip-installed vLLM (staged as tests/gpu/vllm/README.md says)
# on PYTHONPATH, from the repo root (tests/gpu/vllm/engine.sh fork runs it on a copy):
#   bash tests/gpu/vllm/patched_installed.sh
# For each design: `sr-prefetch apply --installed` patches that pip-installed vLLM (no
# build step), the fork's test (as the patch adds it to a source tree) runs against it on
# the GPU, and `sr-prefetch revert --installed` gives the files back; their sha256 before
# and after must match.
# SR_FORK_TESTS=PATTERN runs only the test files whose path matches it (grep), e.g. kernels/mamba.
# Writes the log to $OUT (default /tmp/out).
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
files=(vllm/envs.py vllm/model_executor/layers/mamba/ops/ssu_dispatch.py
       vllm/model_executor/layers/mamba/ops/mamba_ssm.py
       vllm/model_executor/layers/mamba/mamba_mixer2.py
       vllm/v1/worker/gpu_model_runner.py vllm/v1/worker/gpu/model_runner.py
       vllm/v1/worker/gpu/cudagraph_utils.py)
site=$(python3 -c "import importlib.util as u, pathlib as p; print(p.Path(u.find_spec('vllm').origin).parent.parent)")
version=$(python3 -c "import importlib.metadata as m; print(m.version('vllm'))")
log="$out/patched-vllm-$version-nvidia-h200.log"
hashes() { (cd "$site" && sha256sum "${files[@]}"); }
status=0
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"
  echo "installed vLLM: $site"
  before=$(hashes)
  for design in reset forward-context; do
    echo "=== $design"
    python3 -m vllm_patch apply --installed --design "$design" || status=1
    python3 -m vllm_patch status --installed || status=1
    # The fork's tests, as the patch adds them to a source tree of this release.
    tests=$(python3 -c "
import pathlib, sys
from vllm_patch import fork_test
from vllm_patch.releases import Design
from vllm_patch.targets import ssu_dispatch
root, ssu = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[3]) / ssu_dispatch.PATH
for path, text in fork_test.files(Design(sys.argv[2]), ssu.read_text()).items():
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)
    print(path)
" "/tmp/forktest-$design" "$design" "$site") || status=1
    # SR_FORK_TESTS (a grep pattern) keeps the test files it matches, e.g. "kernels/mamba".
    [ -z "${SR_FORK_TESTS:-}" ] || tests=$(printf '%s\n' $tests | grep -- "$SR_FORK_TESTS")
    (cd "/tmp/forktest-$design" && python3 -m pytest $tests -v -p no:cacheprovider) || status=1
    python3 -m vllm_patch revert --installed || status=1
  done
  after=$(hashes)
  if [ "$before" = "$after" ]; then
    echo "reverted: the installed files are byte for byte what pip installed"
  else
    echo "NOT reverted byte for byte"; diff <(echo "$before") <(echo "$after"); status=1
  fi
  echo "exit status $status"
  exit $status
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
