#!/usr/bin/env bash
# Stop 47's second device batch (H100). The first (device_batch_s47.sh) found fp16 layernorm's sketch cost at
# 4096x16384 is the half wave of L2 prefetch the sketched Welford launch takes (none: +0.8 % flushed against +5 %);
# here the other prefetched row lengths, 8192x8192 (half a wave) and 16384x4096 (a wave), none against the
# table's, and 2048x32768 (no prefetch) a quarter wave. rope: smaller tiles (64 heads; 32 heads at 4 warps) and
# keep 4 at 4096x128x128 and Llama-8B's q, 16384x32x128. One round each, bf16 and fp16.
#   bash bench/device_batch_s47b.sh      # on the device; tables to stdout
set -u
export PYTHONUNBUFFERED=1 BENCH_DTYPES=bfloat16,float16
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for shape in 8192x8192 16384x4096; do
  echo "== layernorm $shape"
  BENCH_SHAPE=$shape BENCH_OPS=layernorm BENCH_CONFIGS='{"layernorm": [{"prefetch": 0}, {"defer": true},
    {"defer": true, "prefetch": 0}]}' timeout 150 python bench/ncu_kernels.py --time 2>&1 | grep "^|" | grep -v compile
done
echo "== layernorm 2048x32768"
BENCH_SHAPE=2048x32768 BENCH_OPS=layernorm BENCH_CONFIGS='{"layernorm": [{"prefetch": 0.25}, {"defer": true},
  {"defer": true, "prefetch": 0.25}]}' timeout 150 python bench/ncu_kernels.py --time 2>&1 | grep "^|" | grep -v compile
for shape in 4096x128x128 16384x32x128; do
  echo "== rope $shape"
  BENCH_SHAPE=$shape BENCH_OPS=rope BENCH_CONFIGS='{"rope": [{"keep": 4}, {"block_h": 64}, {"block_h": 64, "keep": 4},
    {"block_h": 32, "num_warps": 4}]}' timeout 150 python bench/ncu_kernels.py --time 2>&1 | grep "^|" | grep -v compile
done
