#!/usr/bin/env bash
# Stop 40's candidate, for the next device run: layernorm's Welford sketch as persistent programs
# (persist=True) against the shipped records and finisher, in interleaved rounds (bench/norm_chunks.py),
# L2 flushed at four shapes, then 4096x16384 from CUDA graphs and in float16.
# Writes $OUT/ln_persist_<shape>[_<method|dtype>].md; prints their layernorm rows.
set -u
CFG='{"layernorm": [{"persist": true}, {"persist": true, "prefetch": 1}, {"persist": true, "prefetch": 0}]}'
run() {  # name, then env assignments
    local name=$1; shift
    env BENCH_NEIGHBOURS=0 BENCH_OPS=layernorm BENCH_ROUNDS=${LN_ROUNDS:-5} BENCH_CONFIGS="$CFG" "$@" \
        timeout 240 python bench/norm_chunks.py > /dev/null 2>&1
    mv "$OUT/norm_chunks.md" "$OUT/ln_persist_${name}.md" 2>/dev/null
    echo "== $name"; grep -E "^\| layernorm|welford" "$OUT/ln_persist_${name}.md" | head -14
}
for shape in ${LN_SHAPES:-4096x16384 8192x8192 16384x4096 2048x32768}; do
    run "$shape" BENCH_SHAPE="$shape"
done
run 4096x16384_graph BENCH_SHAPE=4096x16384 BENCH_METHOD=graph
run 4096x16384_fp16 BENCH_SHAPE=4096x16384 BENCH_DTYPE=float16
