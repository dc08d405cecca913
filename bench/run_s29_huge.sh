#!/bin/bash
# Stop 29's device run: softmax's HUGE branch by lane-local counts (no cross-warp -inf test), checked on the
# GPU (HF masks beside -inf and HUGE values) and timed against stop 28 (bench/.ab/optwin_s29base = f08ae1d).
export PYTHONUNBUFFERED=1
BENCH_OPS=softmax python bench/row_records_check.py > $OUT/check.log 2>&1; mv $OUT/row_records_check.md $OUT/softmax_check_h200_s29b.md
grep -c "ok |" $OUT/softmax_check_h200_s29b.md; grep "FAIL\|off their\|| softmax | [12] " $OUT/softmax_check_h200_s29b.md
for shape in 4096x16384 8192x8192; do
  BENCH_AB=s29base BENCH_OPS="softmax,softmax (hf mask)" BENCH_ROUNDS=5 BENCH_SHAPE=$shape python bench/norm_chunks.py > $OUT/nc_$shape.log 2>&1
  mv $OUT/norm_chunks.md $OUT/softmax_huge_${shape}_h200_s29.md
  grep "^| softmax" $OUT/softmax_huge_${shape}_h200_s29.md
done
