#!/usr/bin/env bash
# Stop 47's fourth device batch (H100): issue #6's official kernel bench with both H100 entries in place (layernorm's
# prefetch off, rope's sketched launch at 32 heads and 4 warps), then the shipped rope launches at Llama-8B's q.
#   bash bench/device_batch_s47d.sh      # on the device; results under $OUT
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== kernels"; timeout 300 python bench/bench_kernels.py 2>&1 | tail -40
echo "== rope 16384x32x128"
BENCH_SHAPE=16384x32x128 BENCH_OPS=rope BENCH_DTYPES=bfloat16,float16 timeout 100 python bench/ncu_kernels.py --time 2>&1 \
  | grep "^|" | grep -v compile
