#!/usr/bin/env bash
# Stop 46's device batch, in one call (a machine start costs minutes of the session's 30): issue #6's official
# kernel bench, then the two twin checks written in stop 45 and never run (layernorm widths where nvcc's FMA choice
# shows, and autocast's CUDA-only float32 rows). Each step has its own time limit so one slow step cannot take the
# others' results with it.
#   bash bench/device_batch_s46.sh      # on the device; results under $OUT
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== kernels"; timeout 330 python bench/bench_kernels.py 2>&1 | tail -80
echo "== layernorm widths"; timeout 90 python bench/gpu_layernorm_widths.py --rows 8 2>&1 | tail -30
echo "== autocast"; timeout 60 python bench/gpu_autocast_dtypes.py 2>&1 | tail -30
ls -la "$OUT"
