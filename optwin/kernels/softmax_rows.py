"""The softmax sketch of a launch with a program per row (softmax._softmax_kernel's ROWS): each row's program
stores its partials as two record words, and one more program, the finisher, polls and reduces them (the
way rmsnorm's and layernorm's row launches publish, _common.poll_records).

Why: without the sketch softmax runs a program per row (_common.ROW_GRID), the hardware handing each row to
the SM that frees up first; the persistent sketched launch gives each program a static share of rows and
merges with atomics once per program. H200, 4096x16384 bf16, µs (bench/results/softmax_probe_4096x16384_h200_s35.md):
the plain kernel 70.4 a program per row, 73.6 persistent; the persistent sketched kernel 78.4. A program per
row merging through the workspace's atomics ran 102.8 (stop 28: 49k atomics on a few addresses); stop 28's
row records (commit fa3e641, then at 16 warps) ran 81.4 against 82.0 and were reverted; at stop 32's 8 warps
the same code ran 75.8 against 77.8 (bench/results/softmax_wd_4096x16384_h200_s35.md). This launch: 75.8 against
78.0 at 4096x16384, 73.6 against 76.9 at 8192x8192 (softmax.ROWS_BLOCKS has the rest).
Stop 37: a row's lane squares and -inf count ride in its sum tree (softmax._row_sums_lanes; the tree after the row
held its program's slot), and the finisher reduces in one tree: 75.7 -> 74.4 µs, HF-masked 81.0 -> 78.4,
8192x8192 73.6 -> 72.8 (bench/results/softmax_merged_tree_*_h200_s37.md). Where the rest of 4096x16384's sketch
cost is (bench/finisher_timeline.py: globaltimer stamps, µs from the first row's start, medians of 20 launches,
softmax_timeline_merged_h200_s37.md): the last row ends at 65.8 without the sketch, 67.4 with it and no
finisher polling (PROBE 8192), 69.5 with the finisher; the finisher ends 2.0 after the last row. So the rows'
sketch work is ~1.6 µs, the finisher's presence ~2 and its tail ~2. Not what the finisher costs (stop 37,
softmax_finisher_*_h200_s37.md; the probes' code is in ab33ac9 and ea58470): system-scope polls (relaxed
gpu-scope ones ran the same), busy polling (a 200 ns nap between polls the same, 1000 ns slower), its place in
the grid (program 2000, 3000 or 3600 of 4097: within 0.4 µs); 128 rows a poll ran as 512, 2048 and 4096
slower (80.2, 89.8: one program reducing that many rows at once).

A row's words (sketch_buffer.row_records, two a row; no half of a written word is the sentinel):
    word 0: (m, rmin)   the row's max and its min over non-(-inf) entries (float32; -inf / +inf: fully masked)
    word 1: (sq, counts) sq the row's sum of squares over non-(-inf) entries as float32, scaled by 2^-144
            where max(m, -rmin) >= HUGE (the kernel's HUGE rows: finite |h| up to 3.4e38, whose squares
            only float64 holds), counts = -inf entries << 2 | eligible << 1 | peaked (int32)
A row with NaN or +inf (the kernel's exact pass ran for it) merges its exact partials into the "softmax"
workspace with scalar atomics and flags word 1 (released after them); the finisher acquires each flag and,
if any row was flagged, adds the workspace to its totals and resets it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.kernels import deferred
from optwin.kernels._common import (
    INTERPRET,
    RECORD_FLAG_HI,
    RECORD_POLL,
    WS_SLOTS,
    acquire_flagged,
    globaltimer,
    poll_records,
    record_word,
    release_flag,
)
from optwin.kernels.fast_launch import launch
from optwin.kernels.softmax_sketch import (
    HUGE,
    HUGE_SCALE,
    HUGE_UNSCALE,
    _atomic_partials,
    _store_features,
    take_workspace,
)


@triton.jit
def _store_row_record(M_ptr, r, F_ptr, I_ptr, p_max, p_min, p_rng, p_rmx, p_sq, p_nf, p_neg, p_masked, p_peak,
                      p_elig, exact):
    """Row r's partials (fresh_partials' order, one row's) as its two record words; `exact`: the kernel's
    exact pass ran (NaN/+inf): the partials go to the workspace and word 1 is the flag."""
    words = M_ptr + tl.cast(r, tl.int64) * 2
    if exact:
        _atomic_partials(F_ptr, I_ptr, p_max, p_min, p_rng, p_rmx, p_sq, p_nf, p_neg, p_masked, p_peak, p_elig, 2.0)
        zero = tl.zeros((), dtype=tl.float32)
        tl.store(words, record_word(zero, zero))
        release_flag(words + 1)
    else:
        huge = tl.maximum(p_max, -p_min) >= HUGE
        sq = tl.where(huge, p_sq * (HUGE_SCALE * HUGE_SCALE), p_sq).to(tl.float32)
        counts = (p_neg.to(tl.int32) << 2) | (p_elig << 1) | p_peak
        tl.store(words, record_word(p_max, p_min))
        tl.store(words + 1, record_word(sq, counts.to(tl.float32, bitcast=True)))


@triton.jit
def _extremes_sums(a0, a1, a2, a3, a4, a5, a6, a7, a8, b0, b1, b2, b3, b4, b5, b6, b7, b8):
    """The finisher's one tree: max, min, max, min, then five sums (one exchange between the warps at the
    kernel's end, where two trees had two)."""
    return (tl.maximum(a0, b0), tl.minimum(a1, b1), tl.maximum(a2, b2), tl.minimum(a3, b3), a4 + b4, a5 + b5,
            a6 + b6, a7 + b7, a8 + b8)


@triton.jit
def _finish_row_records(S_ptr, F_ptr, I_ptr, M_ptr, n_rows, n_cols, POLL: tl.constexpr, T_ptr,
                        STAMPS: tl.constexpr = False):
    """The finisher: every row's record words polled in row order (POLL at once), reduced into the launch's
    totals (the persistent kernel's partials, row by row), the flagged rows' workspace added, the features
    stored. The range is kept halved, as the row loop keeps it. STAMPS (bench only): each poll's arrival and
    the end as globaltimer stamps into T_ptr (bench/finisher_timeline.py)."""
    v_max = tl.full([POLL], -float("inf"), tl.float32)
    v_min = tl.full([POLL], float("inf"), tl.float32)
    v_rng = tl.zeros([POLL], dtype=tl.float32)
    v_rmx = tl.full([POLL], float("inf"), tl.float32)
    v_sq = tl.zeros([POLL], dtype=tl.float64)
    v_neg = tl.zeros([POLL], dtype=tl.int64)
    v_masked = tl.zeros([POLL], dtype=tl.int32)
    v_peak = tl.zeros([POLL], dtype=tl.int32)
    v_elig = tl.zeros([POLL], dtype=tl.int32)
    first_flagged = n_rows
    for r0 in range(0, n_rows, POLL):
        lo, hi = poll_records(M_ptr, r0, n_rows, POLL, 2)
        if STAMPS:  # bench only: when this poll's records were all in
            tl.store(T_ptr + 2 * n_rows + r0 // POLL, globaltimer(r0))
        m_bits, sq_bits = tl.split(lo)  # word 0 = (m, rmin), word 1 = (sq, counts or the flag)
        rmin_bits, counts = tl.split(hi)
        rows = r0 + tl.arange(0, POLL)
        flagged = counts == RECORD_FLAG_HI
        plain = (rows < n_rows) & ~flagged
        m = m_bits.to(tl.float32, bitcast=True)
        rmin = rmin_bits.to(tl.float32, bitcast=True)
        v_max = tl.maximum(v_max, tl.where(plain, m, -float("inf")))
        v_min = tl.minimum(v_min, tl.where(plain, rmin, float("inf")))
        v_rng = tl.maximum(v_rng, tl.where(plain, 0.5 * m - 0.5 * rmin, 0.0))  # fully masked rows: -inf
        v_rmx = tl.minimum(v_rmx, tl.where(plain & (m > -float("inf")), m, float("inf")))
        huge = tl.maximum(m, -rmin) >= HUGE
        sq = sq_bits.to(tl.float32, bitcast=True).to(tl.float64)
        v_sq += tl.where(plain, tl.where(huge, sq * HUGE_UNSCALE, sq), 0.0)
        v_neg += tl.where(plain, counts >> 2, 0).to(tl.int64)
        v_masked += (plain & (m == -float("inf"))).to(tl.int32)
        v_peak += tl.where(plain, counts & 1, 0)
        v_elig += tl.where(plain, (counts >> 1) & 1, 0)
        first_flagged = tl.minimum(first_flagged, acquire_flagged(M_ptr, flagged, rows, n_rows, 2))
    if INTERPRET:  # no tuple reduce in the interpreter
        g_max, g_min, g_rng, g_rmx, s_sq = tl.max(v_max), tl.min(v_min), tl.max(v_rng), tl.min(v_rmx), tl.sum(v_sq)
        s_neg, s_masked, s_peak, s_elig = tl.sum(v_neg), tl.sum(v_masked), tl.sum(v_peak), tl.sum(v_elig)
    else:
        g_max, g_min, g_rng, g_rmx, s_sq, s_neg, s_masked, s_peak, s_elig = tl.reduce(
            (v_max, v_min, v_rng, v_rmx, v_sq, v_neg, v_masked, v_peak, v_elig), 0, _extremes_sums)
    g_max = g_max.to(tl.float64)
    g_min = g_min.to(tl.float64)
    g_rng = g_rng.to(tl.float64) * 2.0
    g_rmx = g_rmx.to(tl.float64)
    g_nf = tl.zeros((), dtype=tl.int64)
    s_masked = s_masked.to(tl.int64)
    s_peak = s_peak.to(tl.int64)
    s_elig = s_elig.to(tl.int64)
    if first_flagged < n_rows:  # the flagged rows' partials; untouched, the workspace is still at its identities
        w_sq, w_max, w_min, w_rng, w_rmx, g_nf, w_neg, w_masked, w_peak, w_elig = take_workspace(F_ptr, I_ptr)
        s_sq += w_sq
        g_max = tl.maximum(g_max, w_max)
        g_min = tl.minimum(g_min, w_min)
        g_rng = tl.maximum(g_rng, w_rng)
        g_rmx = tl.minimum(g_rmx, w_rmx)
        s_neg += w_neg
        s_masked += w_masked
        s_peak += w_peak
        s_elig += w_elig
    g_amax = tl.maximum(tl.maximum(g_max, -g_min), 0.0)
    _store_features(S_ptr, n_rows, n_cols, g_amax, s_sq, g_max, g_min, g_rng, g_rmx, g_nf, s_neg, s_masked, s_peak,
                    s_elig)
    if STAMPS:
        tl.store(T_ptr + 2 * n_rows + tl.cdiv(n_rows, POLL), globaltimer(n_rows))


@triton.jit
def _finish_deferred_kernel(S_ptr, F_ptr, I_ptr, M_ptr, D_ptr, FEATURES: tl.constexpr, POLL: tl.constexpr):
    """Deferred finishing (optwin.kernels.deferred): program k finishes a page's call k, the records its rows
    stored (all in before this launch, on the same stream: the polls find them at once) at word D[k, 0], its
    D[k, 1] rows of D[k, 2] columns, its workspace row and its row of the batch's features."""
    k = tl.program_id(0)
    off = tl.load(D_ptr + 3 * k)
    n_rows = tl.load(D_ptr + 3 * k + 1).to(tl.int32)
    n_cols = tl.load(D_ptr + 3 * k + 2).to(tl.int32)
    _finish_row_records(S_ptr + k * FEATURES, F_ptr + k * 2 * WS_SLOTS, I_ptr + k * WS_SLOTS, M_ptr + off, n_rows,
                        n_cols, POLL, M_ptr)


def finish_deferred(page: deferred.Page, features: torch.Tensor, desc: torch.Tensor, calls: int) -> None:
    """optwin.kernels.deferred's finisher for softmax: a program per settling call, at the warps of the row
    launches whose records it reads (8 at ROWS_BLOCKS), so each poll spreads as the in-launch finisher's does."""
    launch(_finish_deferred_kernel, (calls,), features, page.ws_f, page.ws_i, page.records, desc,
           FEATURES=features.shape[1], POLL=RECORD_POLL, num_warps=8)


deferred.register_finisher("softmax", finish_deferred)
