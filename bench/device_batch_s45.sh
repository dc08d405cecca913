#!/usr/bin/env bash
# Stop 45's device batch, in one call (a machine start costs minutes of the session's 30): patch() on real HF models
# on the GPU, rope's AHEAD launches against the shipped one, and the twins changed under TWIN_VERSION 2 against
# CUDA. Each step has its own time limit so one slow step cannot take the others' results with it.
#   bash bench/device_batch_s45.sh      # on the device; results under $OUT (at most 8 files come back)
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== patch check"; timeout 120 python bench/gpu_patch_check.py 2>&1 | tail -40
echo "== rope ahead"; ROUNDS=4 timeout 300 bash bench/run_rope_ahead.sh
rm -f "$OUT"/*.log
echo "== twins"; timeout 150 python bench/gpu_twin.py --cases 120 --triton --ops rmsnorm,layernorm,geodesic 2>&1 | tail -40
ls -la "$OUT"
