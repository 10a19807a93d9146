#!/usr/bin/env bash
# On the GPU machine, from the repo root: where a failed check of the seed op crashes.
# A native backtrace at the fault (segv.c, preloaded), the .cu and a .cpp with the same
# kind of failed check, on CPU and CUDA buffers, and the toolchain that built them.
# Writes $OUT/fault.log and $OUT/toolchain.txt.
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
export TORCH_EXTENSIONS_DIR=/tmp/torch_ext_fault PYTHONPATH=$PWD
gcc -shared -fPIC -O1 -o /tmp/segv.so tests/gpu/fault/segv.c
for args in "cpp cpu" "cpp cpu,cuda" "cu cpu" "cu cuda"; do
  echo "== $args"
  # shellcheck disable=SC2086
  LD_PRELOAD=/tmp/segv.so timeout 120 python3 tests/gpu/fault/call_op.py $args 2>&1 \
    | grep -vi warn | tail -40
  echo "exit status ${PIPESTATUS[0]}"
done > "$out/fault.log" 2>&1
{
  g++ --version | head -1
  env | grep -E "^(TORCH|LD_|CUDA)" || true
  ldconfig -p | grep -E "libstdc|libgcc_s|libunwind"
  so=$(ls "$TORCH_EXTENSIONS_DIR"/fault_cu_stock_seeds_*/*.so)
  readelf -lW "$so" | grep -i eh_frame
  ldd "$so"
  cat "$TORCH_EXTENSIONS_DIR"/fault_cu_stock_seeds_*/build.ninja
} > "$out/toolchain.txt" 2>&1
cat "$out/fault.log"
