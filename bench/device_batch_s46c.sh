#!/usr/bin/env bash
# Stop 46's third device batch: does fp16 layernorm's sketch cost come from the packed max |x| (HMNMX2 on fp16
# pairs, beside the HADD2.F32 conversions)? The shipped launch against packed=False, in the launch and
# deferred, bf16 and fp16, three rounds of ncu_kernels.py --time (do_bench flushed, CUDA graph).
#   bash bench/device_batch_s46c.sh      # on the device
set -u
export PYTHONUNBUFFERED=1 BENCH_OPS=layernorm BENCH_DTYPES=bfloat16,float16
export BENCH_CONFIGS='{"layernorm": [{"packed": false}, {"defer": true}, {"defer": true, "packed": false}]}'
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for round in 1 2 3; do echo "== round $round"; timeout 150 python bench/ncu_kernels.py --time 2>&1 | tail -22; done
