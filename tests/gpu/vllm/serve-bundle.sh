#!/usr/bin/env bash
# Here, from the project root, on a machine that reaches the package registries (~10 s):
# lays out .e2e/s3 (~9 MiB, git-ignored): the wheels `vllm serve` and `vllm bench serve`
# of vLLM 0.26.0 import beyond the 0.26.0 bundle (../shared/gpu/vllm-0.26/build-bundle.sh:
# .e2e/s1, .e2e/s2) and, since the H200 image's set is not listed, the ones the
# engine path already loads there too (stage-serve.sh installs only those that do not
# import), with stage-serve.sh, the device-side step.
#   uvicorn, click, h11, httptools, uvloop, watchfiles: the HTTP server (launcher.py;
#     api_server.py imports uvloop; serve/utils/ssl.py watchfiles)
#   prometheus-client, prometheus-fastapi-instrumentator: /metrics (serve/instrumentator)
#   model-hosting-container-standards, jmespath: serve/sagemaker (api_server.py imports it)
#   aiohttp and its parts, tqdm: the client (vllm.benchmarks.serve, lib/endpoint_request_func)
# Found by importing 0.26.0's vllm.entrypoints.openai.api_server, cli.main, launcher,
# benchmarks.serve and building its FastAPI app (build_app) over the bundle.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
E=$PWD/.e2e
exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
grep -qx '/.e2e/' "$exclude" 2>/dev/null || echo '/.e2e/' >> "$exclude"
mkdir -p "$E/dl/serve"; rm -rf "$E/s3"; mkdir -p "$E/s3"
pipd() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 "$@"; }
pipd -d "$E/dl/serve" uvicorn==0.55.0 click==8.5.1 h11==0.16.0 httptools==0.9.0 uvloop==0.23.0 \
  watchfiles==1.3.0 anyio==4.16.0 idna==3.20 prometheus-client==0.26.0 \
  prometheus-fastapi-instrumentator==8.1.0 model-hosting-container-standards==0.1.16 \
  jmespath==1.1.0 aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 \
  frozenlist==1.8.0 multidict==7.2.1 propcache==0.5.4 yarl==1.25.1 tqdm==4.70.1
cp "$E"/dl/serve/*.whl "$E/s3/"
cp "$here/stage-serve.sh" "$E/s3/"
du -sh "$E/s3"
total=$(du -sm --total "$E/s3" $( [ -d "$E/s2" ] && echo "$E/s2") | tail -1 | cut -f1)
repo=$(git ls-files -z | xargs -0 du -cm 2>/dev/null | tail -1 | cut -f1)
echo "s3 + s2 + the repository: ~$((total + repo)) MiB of a call's 64"
[ $((total + repo)) -lt 64 ] || { echo "too large for one call: carry .e2e/s3 without .e2e/s2"; exit 1; }
