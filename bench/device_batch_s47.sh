#!/usr/bin/env bash
# Stop 47's first device batch: the two sketch costs above 3 % in stop 46 (H100). fp16 layernorm 4096x16384:
# the sketched Welford launch prefetches half a wave of rows into the L2 (_common.PREFETCH, tuned on the H200,
# where fp16 moved 84.7 -> 73.7 µs with the prefetch depth while bf16 did not move); here none, a quarter and a
# whole wave, in the launch and deferred. rope 4096x128x128: the lane accumulators' chains (keep 1, 4), the next
# tile loaded ahead, the compiler's register count, two loop stages. Two rounds of ncu_kernels.py --time
# (do_bench L2 flushed / CUDA graph), bf16 and fp16.
#   bash bench/device_batch_s47.sh      # on the device; tables to stdout
set -u
export PYTHONUNBUFFERED=1 BENCH_DTYPES=bfloat16,float16
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for round in 1 2; do
  echo "== round $round: layernorm"
  BENCH_OPS=layernorm BENCH_CONFIGS='{"layernorm": [{"prefetch": 0}, {"prefetch": 0.25}, {"prefetch": 1},
    {"defer": true}, {"defer": true, "prefetch": 0}, {"defer": true, "prefetch": 0.25}, {"defer": true, "prefetch": 1}]}' \
    timeout 200 python bench/ncu_kernels.py --time 2>&1 | grep -v "torch.compile\|Warning\|warn" | tail -34
  echo "== round $round: rope"
  BENCH_OPS=rope BENCH_CONFIGS='{"rope": [{"keep": 1}, {"keep": 4}, {"ahead": true}, {"maxnreg": 0}, {"stages": 2}]}' \
    timeout 150 python bench/ncu_kernels.py --time 2>&1 | grep -v "torch.compile\|Warning\|warn" | tail -26
done
