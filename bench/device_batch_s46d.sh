#!/usr/bin/env bash
# Stop 46's fourth device batch: where fp16 layernorm's sketch cost is. The deferred launch (the rows' kernel
# and the parameters' program only) with parts of the sketch left out (PROBE bits: 1 no max |h|, 4 no flagged-row
# path) and the compiler's register count, bf16 and fp16, one round of ncu_kernels.py --time. Not PROBE 2 (no
# records): a deferred page's finisher then waits for records that never come (the first try of this batch hung
# until its time limit).
#   bash bench/device_batch_s46d.sh      # on the device
set -u
export PYTHONUNBUFFERED=1 BENCH_OPS=layernorm BENCH_DTYPES=bfloat16,float16
export BENCH_CONFIGS='{"layernorm": [{"defer": true}, {"defer": true, "probe": 1}, {"defer": true, "probe": 5}, {"defer": true, "maxnreg": 0}]}'
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 150 python bench/ncu_kernels.py --time 2>&1 | grep -v "torch.compile" | tail -24
