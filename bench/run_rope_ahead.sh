#!/usr/bin/env bash
# Rope's AHEAD launches (the next tile's x loaded before this tile's work) against the shipped launch, bf16, in
# interleaved rounds: L2 flushed at the official shape (4096 x 128 x 128) and Llama-8B's q (16384 x 32 x 128), and
# from CUDA graphs at the official shape (bench/run_norm_ab.sh; writes $OUT/rope_ahead*_<shape>.md).
#   bash bench/run_rope_ahead.sh            # stop 44's run: bench/results/rope_ahead*_h200_s44.md
set -u
C='[{"ahead": true, "num_warps": 16}, {"ahead": true, "num_warps": 16, "lane_acc": true, "maxnreg": 128},
    {"ahead": true, "maxnreg": 168}, {"ahead": true, "block_h": 64, "lane_acc": true, "maxnreg": 128},
    {"ahead": true, "block_h": 32, "num_warps": 4, "lane_acc": true}, {"num_warps": 16}]'
bash bench/run_norm_ab.sh rope_ahead rope "4096x16384=$C" "16384x4096=$C"
METHOD=graph bash bench/run_norm_ab.sh rope_ahead_graph rope "4096x16384=$C"
