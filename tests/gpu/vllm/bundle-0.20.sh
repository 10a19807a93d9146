#!/usr/bin/env bash
# Builds, on a machine that reaches PyPI, what the registry-less H200 machine needs to
# run stock vLLM 0.20.0 (the oldest release the patch supports; it pins torch 2.11.0, the
# machine's) in two device calls, into .e2e020/ under the current directory (the project
# root, where /.e2e020/ is git-ignored through .git/info/exclude):
#   .e2e020/s1   vLLM's _C ops (xz, device code for sm_90 only: bundle.py), FA3's ops (xz),
#                and the compiled packages vLLM imports that the machine lacks, but xgrammar
#   .e2e020/s2   vLLM 0.20.0 without the native parts a Mamba-2 hybrid run does not load,
#                FlashInfer 0.6.8.post1 (its pin) trimmed to its Mamba SSU JIT, xgrammar
#                without its static library, and the pure-Python packages vLLM imports
#                that the machine lacks
# Each folder, with the repository beside it, must fit one device call (64 MiB): checked last.
# Downloads are kept in .e2e020/dl. The device side: tests/gpu/vllm/stage-0.20.sh, and
# tests/gpu/vllm/README.md for the calls. About 2 minutes with the downloads cached.
#   bash tests/gpu/vllm/bundle-0.20.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
E=$PWD/.e2e020
if [ -d .git ] && ! grep -qx '/.e2e020/' .git/info/exclude 2>/dev/null; then
  echo '/.e2e020/' >> .git/info/exclude
fi
mkdir -p "$E/dl/deps" "$E/trim"; rm -rf "$E/s1" "$E/s2"; mkdir "$E/s1" "$E/s2"
# vLLM 0.20.0's only x86_64 wheel is manylinux_2_35 (its _C and FA3 need GLIBC_2.34).
pipd() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_35_x86_64 --platform manylinux_2_31_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 "$@"; }
have() { compgen -G "$1" >/dev/null; }
have "$E/dl/vllm-0.20.0-*.whl" || pipd -d "$E/dl" vllm==0.20.0
W=$(ls "$E"/dl/vllm-0.20.0-*.whl)
# The wheel's own pins (Requires-Dist, markers left off): torch==2.11.0,
# flashinfer-python==0.6.8.post1, apache-tvm-ffi==0.1.9, llguidance and xgrammar by range.
# Stop if they are not what this bundle is built for.
python3 - "$W" <<'EOF'
import sys, zipfile
meta = zipfile.ZipFile(sys.argv[1]).read("vllm-0.20.0.dist-info/METADATA").decode()
pins = {
    line.split(": ", 1)[1].split(";")[0].strip()
    for line in meta.splitlines()
    if line.startswith("Requires-Dist: ")
}
want = {"torch==2.11.0", "flashinfer-python==0.6.8.post1", "apache-tvm-ffi==0.1.9",
        "llguidance<1.4.0,>=1.3.0", "xgrammar<1.0.0,>=0.1.32"}
if want - pins:
    sys.exit(f"vLLM 0.20.0's wheel does not pin {sorted(want - pins)}: update bundle-0.20.sh")
EOF
have "$E/dl/flashinfer_python-0.6.8.post1-*.whl" || pipd -d "$E/dl" flashinfer-python==0.6.8.post1
have "$E/dl/apache_tvm_ffi-0.1.9-*.whl" || pipd -d "$E/dl" apache-tvm-ffi==0.1.9
# xgrammar 0.1.32: in the pin's range, it needs no apache-tvm-ffi (0.2.6 on need >=0.1.10,
# against vLLM's ==0.1.9), and without its static library (lib/, for C++ linking only) it
# is 9 MiB (0.2.0-0.2.3: 13 MiB).
have "$E/dl/xgrammar-0.1.32-*.whl" || pipd -d "$E/dl" xgrammar==0.1.32
# What vLLM 0.20.0 imports on the way to an engine that the H200 image lacks: the 0.26.0
# bundle's list within 0.20.0's pins, with gguf (imported by vllm.config.model there) and
# llguidance (xgrammar too, above): vllm.v1.structured_output imports both backends at
# module level, and their dataclasses' annotations load the lazily imported modules.
deps=(cbor2==6.3.0 pyzmq==27.3.0 openai-harmony==0.0.8 openai==3.57.0 httpx2==2.16.2
  httpcore2==2.16.2 sniffio==1.3.1 msgspec==0.23.0 pybase64==1.5.1 cachetools==8.0.2
  fastapi==0.136.3 starlette==1.10.0 partial-json-parser==0.2.1.1.post7 pydantic==2.14.4
  pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 annotated-doc==0.0.7
  nvidia-ml-py==13.615.71 jiter==0.19.0 distro==1.9.0 typing_extensions==4.16.0
  depyf==0.20.0 astor==0.8.1 dill==0.4.1 setproctitle==1.3.8 blake3==1.0.11 gguf==0.19.0
  llguidance==1.3.0)
pipd -d "$E/dl/deps" "${deps[@]}"
python3 "$here/bundle.py" vllm "$W" "$E/trim"   # fatbin pruning and xz: ~1 min
python3 "$here/bundle.py" flashinfer "$E"/dl/flashinfer_python-0.6.8.post1-*.whl "$E/trim"
cp "$E/trim/c.so.xz" "$E/trim/fa3.so.xz" "$E"/dl/apache_tvm_ffi-0.1.9-*.whl "$E/s1/"
python3 "$here/bundle.py" xgrammar "$E"/dl/xgrammar-0.1.32-*.whl "$E/trim"
cp "$E"/trim/vllm-0.20.0-*.whl "$E"/trim/flashinfer_python-0.6.8.post1-*.whl \
  "$E"/trim/xgrammar-0.1.32-*.whl "$E/s2/"
# Compiled wheels go with the other native parts in s1, pure-Python ones in s2; xgrammar
# (compiled, 9 MiB) went to s2 above, as s1 with it and the repository would pass 62 MiB.
for dep in "${deps[@]}"; do
  name=${dep%%==*}; f=$(ls "$E"/dl/deps/"${name//-/_}"-"${dep#*==}"-*.whl)
  case $f in *-none-any.whl) cp "$f" "$E/s2/" ;; *) cp "$f" "$E/s1/" ;; esac
done
# A device call carries the tracked and untracked, not ignored, files of the repository too.
repo=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s -- 2>/dev/null \
  | awk '{n += $1} END {print n + 0}')
python3 "$here/bundle.py" calls "$repo" "$E/s1" "$E/s2"
