#!/bin/bash
# Stop 29's device run: softmax's workspace copies (sketch_buffer.WORKSPACE_COPIES) checked on the GPU and
# timed against stop 28 (bench/.ab/optwin_s29base = f08ae1d). Results under $OUT.
export PYTHONUNBUFFERED=1
BENCH_OPS=softmax python bench/row_records_check.py > $OUT/check.log 2>&1; mv $OUT/row_records_check.md $OUT/softmax_copies_check_h200_s29.md
tail -3 $OUT/check.log
for shape in 4096x16384 8192x8192 256x128256; do
  ops="softmax"; [ $shape = 4096x16384 ] && ops="softmax,softmax (hf mask)"
  BENCH_AB=s29base BENCH_OPS="$ops" BENCH_ROUNDS=5 BENCH_SHAPE=$shape python bench/norm_chunks.py > $OUT/nc_$shape.log 2>&1
  mv $OUT/norm_chunks.md $OUT/softmax_copies_${shape}_h200_s29.md
  grep "^| softmax" $OUT/softmax_copies_${shape}_h200_s29.md
done
