#!/usr/bin/env bash
# Stop 46's fourth device batch: where fp16 layernorm's sketch cost is. The deferred launch (the rows' kernel
# and the parameters' program only) with parts of the sketch left out (PROBE bits: 1 no max |h|, 2 no records,
# 4 no flagged-row path; 7 all three: Welford plus the extra program), and other register caps, bf16 and fp16,
# two rounds of ncu_kernels.py --time.
#   bash bench/device_batch_s46d.sh      # on the device
set -u
export PYTHONUNBUFFERED=1 BENCH_OPS=layernorm BENCH_DTYPES=bfloat16,float16
export BENCH_CONFIGS='{"layernorm": [{"defer": true}, {"defer": true, "probe": 1}, {"defer": true, "probe": 2}, {"defer": true, "probe": 4}, {"defer": true, "probe": 7}, {"defer": true, "maxnreg": 48}, {"defer": true, "maxnreg": 0}, {"defer": true, "maxnreg": 32}]}'
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for round in 1 2; do echo "== round $round"; timeout 200 python bench/ncu_kernels.py --time 2>&1 | grep -v "torch.compile" | tail -40; done
