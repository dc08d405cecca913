#!/usr/bin/env bash
# Stop 49's second device batch: the patch check at the session's head (the patched eager attention now hands its
# scores to an active capture, 1fcb520), then, only where the card is an H200, issue #6's official kernel bench.
#   bash bench/device_batch_s49b.sh      # on the device; results under $OUT
. "$(dirname "$0")/device_common.sh"
echo "== patch check"; timeout 150 python bench/gpu_patch_check.py > "$OUT/patch_check.md" 2>&1; tail -25 "$OUT/patch_check.md"
case "$name" in
  *H200*) echo "== kernels (H200)"; timeout 380 python bench/bench_kernels.py 2>&1 | tee "$OUT/kernels_h200_s49.md" | tail -60 ;;
  *) echo "== kernels skipped: not an H200" ;;
esac
