#!/usr/bin/env bash
# Stop 47's third device batch (H100): issue #6's official kernel bench with layernorm's prefetch off on the H100
# (_common.PREFETCH_ON_DEVICE, from device_batch_s47*.sh); then rope's sketched launch at 32 heads a tile and 4
# warps against the shipped one, three rounds at 4096x128x128 and Llama-8B's q (16384x32x128) (one round of
# device_batch_s47b.sh: CUDA graph -6 µs, L2 flushed the same or +1.6 µs); then whether rmsnorm's and softmax's
# prefetch (tuned on the H200 too) pays on the H100, 4096x16384 and 16384x4096, one round.
#   bash bench/device_batch_s47c.sh      # on the device; results under $OUT
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== kernels"; timeout 300 python bench/bench_kernels.py 2>&1 | tail -60
export BENCH_DTYPES=bfloat16,float16
for round in 1 2 3; do
  for shape in 4096x128x128 16384x32x128; do
    echo "== rope $shape round $round"
    BENCH_SHAPE=$shape BENCH_OPS=rope BENCH_CONFIGS='{"rope": [{"block_h": 32, "num_warps": 4}]}' \
      timeout 100 python bench/ncu_kernels.py --time 2>&1 | grep "^|" | grep -v compile
  done
done
for shape in 4096x16384 16384x4096; do
  echo "== rmsnorm, softmax $shape"
  BENCH_SHAPE=$shape BENCH_OPS=rmsnorm,softmax BENCH_CONFIGS='{"rmsnorm": [{"prefetch": 0}], "softmax": [{"prefetch": 0}]}' \
    timeout 120 python bench/ncu_kernels.py --time 2>&1 | grep "^|" | grep -v compile
done
