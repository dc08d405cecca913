#!/usr/bin/env bash
# Launch overrides of one op A/B'd against its shipped launch, shape by shape, in interleaved rounds
# (bench/norm_chunks.py, BENCH_NEIGHBOURS=0: the shipped launch and the given configs only, torch.compile
# beside them). Writes $OUT/<tag>_<shape>.md and prints the op's rows.
#   bash bench/run_norm_ab.sh TAG OP 'SHAPE=JSON list of configs' ...   # env: ROUNDS (5), METHOD, DTYPE
#   bash bench/run_norm_ab.sh ln_caps layernorm '2048x32768=[{"maxnreg": 40}]' '16384x4096=[{"poll": 128}]'
# Stop 41's runs: ln_caps (the Welford launch's registers and finisher poll), stop 40's persistent
# layernorm programs (bench/results/ln_persist_*_h200_s41.md, configs {"persist": true, ...}, since removed).
set -u
tag=$1 op=$2; shift 2
for spec in "$@"; do
    shape=${spec%%=*} cfgs=${spec#*=}
    env BENCH_NEIGHBOURS=0 BENCH_OPS="$op" BENCH_ROUNDS="${ROUNDS:-5}" BENCH_SHAPE="$shape" \
        BENCH_METHOD="${METHOD:-do_bench}" BENCH_DTYPE="${DTYPE:-bfloat16}" BENCH_CONFIGS="{\"$op\": $cfgs}" \
        timeout 240 python bench/norm_chunks.py > "$OUT/${tag}_${shape}.log" 2>&1
    mv "$OUT/norm_chunks.md" "$OUT/${tag}_${shape}.md" 2>/dev/null
    echo "== $shape"; grep -E "^\| $op \| (torch|default|\{|[a-z_]+=)" "$OUT/${tag}_${shape}.md" | head -12
done
