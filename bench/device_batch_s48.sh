#!/usr/bin/env bash
# Stop 48's first device batch: stop 47's patch() fixes on a GPU (bench/gpu_patch_check.py), then, only where the
# card is an H200 (none came in stops 43-47), issue #6's official kernel bench.
#   bash bench/device_batch_s48.sh      # on the device; results under $OUT
set -u
export PYTHONUNBUFFERED=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $name"
echo "== patch check"; timeout 200 python bench/gpu_patch_check.py 2>&1 | tail -60
case "$name" in
  *H200*) echo "== kernels (H200)"; timeout 330 python bench/bench_kernels.py 2>&1 | tail -40 ;;
  *) echo "== kernels skipped: not an H200" ;;
esac
