#!/usr/bin/env bash
# Stop 40: layernorm's Welford sketch as persistent programs against the records and finisher (A/B in
# interleaved rounds), then the same under CUDA graphs. Writes $OUT/ln_persist_<shape>[_graph].md.
set -u
CFG='{"layernorm": [{"persist": true}, {"persist": true, "prefetch": 1}, {"persist": true, "prefetch": 0}]}'
for shape in ${LN_SHAPES:-4096x16384 8192x8192 16384x4096 2048x32768}; do
    BENCH_NEIGHBOURS=0 BENCH_OPS=layernorm BENCH_SHAPE=$shape BENCH_ROUNDS=${LN_ROUNDS:-5} BENCH_CONFIGS="$CFG" \
        timeout 240 python bench/norm_chunks.py > /dev/null 2>&1
    mv "$OUT/norm_chunks.md" "$OUT/ln_persist_${shape}.md" 2>/dev/null
    grep -E "^\| layernorm|programs per SM|welford" "$OUT/ln_persist_${shape}.md" | head -14
done
