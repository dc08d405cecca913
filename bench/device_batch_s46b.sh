#!/usr/bin/env bash
# Stop 46's second device batch: the layernorm twin's RowwiseMoments model (TWIN_VERSION 4) against
# F.layer_norm at the widths aten does not vectorize, and why fp16 layernorm's sketch costs +4.5 % on the H100
# where bf16's costs 0 (the same config and SASS shape): the launches timed side by side, then Nsight Compute's
# counters, stalls and per-opcode SASS for both dtypes.
#   bash bench/device_batch_s46b.sh      # on the device; results under $OUT
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== layernorm widths"; timeout 90 python bench/gpu_layernorm_widths.py --rows 8 2>&1 | tail -22
echo "== twins"; timeout 120 python bench/gpu_twin.py --cases 120 --ops layernorm 2>&1 | tail -25
export BENCH_OPS=layernorm BENCH_DTYPES=bfloat16,float16
echo "== time"; timeout 120 python bench/ncu_kernels.py --time 2>&1 | tail -12
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || echo ncu)
echo "== ncu details"; timeout 150 "$NCU" --clock-control none --profile-from-start off --section SpeedOfLight \
  --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --csv --page details \
  --log-file "$OUT/ncu_ln_dtypes.csv" python bench/ncu_kernels.py > /dev/null 2>&1; echo "rc $?"
python bench/ncu_kernels.py --summary "$OUT/ncu_ln_dtypes.csv" 2>&1 | tail -12
echo "== ncu stalls"; timeout 120 "$NCU" --clock-control none --profile-from-start off --csv --page raw \
  --log-file "$OUT/ncu_ln_dtypes_stalls.csv" --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
  python bench/ncu_kernels.py > /dev/null 2>&1; echo "rc $?"
python bench/ncu_kernels.py --stalls "$OUT/ncu_ln_dtypes_stalls.csv" 2>&1 | tail -12
echo "== ncu source"; timeout 150 "$NCU" --clock-control none --profile-from-start off --section SourceCounters --page source \
  --print-source sass --csv --log-file "$OUT/ncu_ln_dtypes_source.csv" python bench/ncu_kernels.py > /dev/null 2>&1; echo "rc $?"
python bench/ncu_kernels.py --sass "$OUT/ncu_ln_dtypes_source.csv" 67108864 2>&1 | tail -12
ls -la "$OUT"
