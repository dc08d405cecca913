#!/usr/bin/env bash
# Stop 49's device batch: softmax's row sums for the twin's reduction order (bench/gpu_softmax_sums.py, any card),
# then, only where the card is an H200 (none came in stops 43-48), issue #6's official kernel bench and the patch check.
#   bash bench/device_batch_s49.sh      # on the device; results under $OUT
. "$(dirname "$0")/device_common.sh"
echo "== softmax sums"; timeout 120 python bench/gpu_softmax_sums.py 2>&1 | tail -10
case "$name" in
  *H200*)
    echo "== kernels (H200)"; timeout 330 python bench/bench_kernels.py 2>&1 | tee "$OUT/kernels_h200_s49.md" | tail -60
    echo "== patch check"; timeout 120 python bench/gpu_patch_check.py 2>&1 | tail -30 ;;
  *) echo "== kernels skipped: not an H200" ;;
esac
