"""Softmax with its sketch, a program per row: the launch of 16-bit rows at the widths in ROWS_BLOCKS
(softmax/triton; optwin.kernels.softmax holds the op, its numerics and the persistent launch).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.softmax_rows import softmax_rows_launch; \
x = torch.randn(3, 16384).bfloat16(); y = torch.empty_like(x); print(softmax_rows_launch(x, y, None))"

Why: without the sketch softmax runs a program per row (_common.ROW_GRID): the hardware hands each row
to the SM that frees up first. The persistent sketched launch gives each program a static share of
rows, so programs that met slow memory finish last. H200, 4096x16384 bf16, µs: the plain kernel 70.5 a
program per row, 74.8 persistent; the persistent sketched kernel 81.7, and 80.8 with every sketch
statistic left out of it (bench/results/softmax_probe_h200_s28.md, softmax_grid_h200_s28.md). A
program per row publishing through the workspace's atomics ran 102.8 (49k atomics on 12 addresses).
So here each row's program stores its partials as two record words (sketch_buffer.row_records), as
rmsnorm's and layernorm's row launches do, and one more program, the finisher, polls and reduces them
(_common.poll_records):
    word 0: (m, rmin)   the row's max and its min over non-(-inf) entries (float32)
    word 1: (sq, counts) sq the row's fp32 sum of squares over non-(-inf) entries, scaled by 2^-144 where
            max(m, -rmin) >= HUGE (softmax.packed_row puts such a row's squares in a_huge, scaled, and
            none in a_sq), counts = -inf entries << 2 | eligible << 1 | peaked
y is softmax.packed_row's, the persistent sketched kernel's, bit for bit. A row with NaN or +inf (its
squares are not finite) re-reads itself for exact statistics, merges them into the "softmax" workspace
with scalar atomics (softmax_sketch.merge_partials) and flags word 1 (released after them); the finisher
acquires each flag and, if any row was flagged, adds the workspace to its totals and resets it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.kernels._common import (
    FMAX,
    INTERPRET,
    INTERPRETED,
    RECORD_FLAG_HI,
    RECORD_POLL,
    acquire_flag,
    div_by_row,
    lane_shape,
    launch_config,
    note_occupancy,
    poll_records,
    prefetch_args,
    prefetch_row,
    read_slot,
    record_word,
    register_cap,
    release_flag,
    reset_workspace,
)
from optwin.kernels.fast_launch import launch
from optwin.kernels.packed16 import NEG_INF_PAIR
from optwin.kernels.sketch_buffer import row_records, workspace
from optwin.kernels.softmax import (
    CHUNK,
    HUGE,
    HUGE_UNSCALE,
    KEEP,
    MAXNREG,
    NEG_SAFE,
    PEAK_NATS,
    _lane_count_i32,
    _peaked_exp,
    packed_row,
)
from optwin.kernels.softmax_sketch import (
    _merge_extremes,
    _row_stats_chunked,
    merge_partials,
    store_features,
)

# Row widths (BLOCK) that take this launch with the sketch, 16-bit rows (packed16.packable).
ROWS_BLOCKS = {16384}


@triton.jit
def _sums(sq, neg):
    """(sum sq, sum neg) in one tree (two in the interpreter, which has no tuple reduce)."""
    if INTERPRET:
        return tl.sum(sq), tl.sum(neg)
    else:
        return tl.reduce((sq, neg), None, _add2)


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _extremes(a, b, c, d):
    """(max a, min b, max c, min d) in one tree (four in the interpreter)."""
    if INTERPRET:
        return tl.max(a), tl.min(b), tl.max(c), tl.min(d)
    else:
        return tl.reduce((a, b, c, d), None, _max_min_max_min)


@triton.jit
def _max_min_max_min(a0, a1, a2, a3, b0, b1, b2, b3):
    return tl.maximum(a0, b0), tl.minimum(a1, b1), tl.maximum(a2, b2), tl.minimum(a3, b3)


@triton.jit
def _counts(c, e, p, m):
    """(sum c, sum e, sum p, sum m) in one tree (four in the interpreter)."""
    if INTERPRET:
        return tl.sum(c), tl.sum(e), tl.sum(p), tl.sum(m)
    else:
        return tl.reduce((c, e, p, m), None, _add4)


@triton.jit
def _add4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _softmax_rows_kernel(
    X_ptr,  # x as (n_rows, n_cols), 16-bit, rows read as int32 words (packed16.packable)
    X_row_stride,
    Y_ptr,  # y as (n_rows, n_cols), contiguous
    Y_row_stride,
    S_ptr,  # sketch features, float64
    F_ptr,  # the "softmax" workspace's float64 slots: the flagged rows' partials
    I_ptr,  # its int64 slots
    M_ptr,  # row record words, int64 (>= 2 * n_rows,), all -1 (sketch_buffer.row_records)
    n_rows,
    n_cols,
    peak_nats,  # fp32: entropy below which a row is peaked
    BLOCK: tl.constexpr,
    VEC: tl.constexpr,
    LANES: tl.constexpr,
    KEEP: tl.constexpr,
    BF16: tl.constexpr,
    NEG_PAIR: tl.constexpr,
    NEG_SAFE: tl.constexpr,
    POLL: tl.constexpr,  # rows whose records the finisher reads at once
    CHUNK: tl.constexpr,  # columns per piece of a flagged row's exact pass
    FINISHER_FIRST: tl.constexpr,  # program 0 finishes (a GPU starts it first); else program n_rows (the interpreter)
    PF_BYTES: tl.constexpr = 0,  # bytes of a row to prefetch into L2 (_common.prefetch_row); 0: none
    pf_ahead=0,  # the row prefetched is pf_ahead rows past this program's
):
    pid = tl.program_id(0)
    if pid != (0 if FINISHER_FIRST else n_rows):
        r = pid - 1 if FINISHER_FIRST else pid
        row = tl.cast(r, tl.int64)
        prefetch_row(X_ptr, r, pf_ahead, n_rows, X_row_stride, PF_BYTES)
        wcols = tl.arange(0, BLOCK // 2)
        wmask = wcols < n_cols // 2
        Xw = (X_ptr + row * X_row_stride).to(tl.pointer_type(tl.int32))
        w = tl.load(Xw + wcols, mask=wmask, other=NEG_PAIR, eviction_policy="evict_first")
        zeros = tl.zeros([LANES, KEEP], dtype=tl.float32)
        e, s, t, m, rmin, a_sq, a_neg, a_huge = packed_row(w, Xw, wcols, wmask, zeros, tl.zeros([LANES, KEEP], tl.int32),
                                                           zeros, BF16, BLOCK, LANES, VEC, KEEP, NEG_PAIR, NEG_SAFE)
        # a row's squares are all in a_sq or all (scaled) in a_huge: one of the two sums is 0
        sq, neg = _sums(a_sq + a_huge, _lane_count_i32(a_neg))
        neg -= BLOCK - n_cols  # the padding halves read as -inf
        elig = (s <= FMAX).to(tl.int32)  # NaN for rows with NaN/+inf or no finite entry
        counts = neg * 4 + elig * 2 + _peaked_exp(s, t, peak_nats)
        # before y: the finisher's wait ends with the last row's sums, not with its stores
        tl.store(M_ptr + row * 2, record_word(m, rmin))
        finite = sq <= FMAX  # NaN/+inf make the squares non-finite: the rare rest after y
        if finite:
            tl.store(M_ptr + row * 2 + 1, record_word(sq, counts))
        y = div_by_row(e, s)
        cols = tl.arange(0, BLOCK)
        tl.store(Y_ptr + row * Y_row_stride + cols, y.to(Y_ptr.dtype.element_ty), mask=cols < n_cols,
                 eviction_policy="evict_first")
        if not finite:
            _publish_flagged_row(X_ptr + row * X_row_stride, M_ptr + row * 2 + 1, F_ptr, I_ptr, n_cols, elig,
                                 counts % 2, CHUNK)
    else:  # the finisher: the records in row order, POLL rows a poll
        v_max = tl.full([POLL], -float("inf"), tl.float32)
        v_min = tl.full([POLL], float("inf"), tl.float32)
        v_rng = tl.zeros([POLL], dtype=tl.float32)  # half the widest row range (3e38 - (-3e38) fits)
        v_rmx = tl.full([POLL], float("inf"), tl.float32)
        v_sq = tl.zeros([POLL], dtype=tl.float64)
        v_neg = tl.zeros([POLL], dtype=tl.int64)
        v_elig = tl.zeros([POLL], dtype=tl.int32)
        v_peak = tl.zeros([POLL], dtype=tl.int32)
        v_masked = tl.zeros([POLL], dtype=tl.int32)
        first_flagged = n_rows
        for r0 in range(0, n_rows, POLL):
            lo, hi = poll_records(M_ptr, r0, n_rows, POLL, 2)
            m_bits, sq_bits = tl.split(lo)
            rmin_bits, tag = tl.split(hi)
            rows = r0 + tl.arange(0, POLL)
            flagged = tag == RECORD_FLAG_HI
            plain = (rows < n_rows) & ~flagged
            m = tl.where(plain, m_bits.to(tl.float32, bitcast=True), -float("inf"))
            rmin = tl.where(plain, rmin_bits.to(tl.float32, bitcast=True), float("inf"))
            sq = sq_bits.to(tl.float32, bitcast=True).to(tl.float64)
            v_sq += tl.where(plain, tl.where(tl.maximum(m, -rmin) >= HUGE, sq * HUGE_UNSCALE, sq), 0.0)
            v_max = tl.maximum(v_max, m)  # fully masked rows: m = -inf, rmin = +inf
            v_min = tl.minimum(v_min, rmin)
            v_rng = tl.maximum(v_rng, 0.5 * m - 0.5 * rmin)
            v_rmx = tl.minimum(v_rmx, tl.where(m > -float("inf"), m, float("inf")))
            counts = tl.where(plain, tag, 0)
            v_neg += (counts >> 2).to(tl.int64)
            v_elig += (counts >> 1) & 1
            v_peak += counts & 1
            v_masked += (plain & (m == -float("inf"))).to(tl.int32)
            r = tl.min(tl.where(flagged, rows, n_rows), axis=0)
            first_flagged = tl.minimum(first_flagged, r)
            while r < n_rows:  # rare: each flagged row merged its partials into the workspace before its flag
                acquired = acquire_flag(M_ptr + r * 2 + 1)  # 1, behind the acquire
                r = tl.min(tl.where(flagged & (rows > r), rows, n_rows) * acquired, axis=0)
        g_max, g_min, g_rng, g_rmx = _extremes(v_max, v_min, v_rng, v_rmx)
        g_sq, g_neg = _sums(v_sq, v_neg)
        g_elig, g_peak, g_masked, _ = _counts(v_elig, v_peak, v_masked, v_masked)
        g_amax = tl.maximum(tl.maximum(g_max, -g_min), 0.0).to(tl.float64)
        g_max, g_min = g_max.to(tl.float64), g_min.to(tl.float64)
        g_rng, g_rmx = g_rng.to(tl.float64) * 2.0, g_rmx.to(tl.float64)
        g_nf = tl.zeros((), dtype=tl.int64)
        g_elig, g_peak, g_masked = g_elig.to(tl.int64), g_peak.to(tl.int64), g_masked.to(tl.int64)
        if first_flagged < n_rows:  # the flagged rows' partials; untouched, the workspace is still at its identities
            g_amax = tl.maximum(g_amax, read_slot(F_ptr + 0))
            g_sq += read_slot(F_ptr + 1)
            g_max = tl.maximum(g_max, read_slot(F_ptr + 2))
            g_min = tl.minimum(g_min, read_slot(F_ptr + 3))
            g_rng = tl.maximum(g_rng, read_slot(F_ptr + 4))
            g_rmx = tl.minimum(g_rmx, read_slot(F_ptr + 5))
            g_nf = read_slot(I_ptr + 1)
            g_neg += read_slot(I_ptr + 2)
            g_masked += read_slot(I_ptr + 3)
            g_peak += read_slot(I_ptr + 4)
            g_elig += read_slot(I_ptr + 5)
            reset_workspace(F_ptr, I_ptr)
        store_features(S_ptr, g_amax, g_sq, g_max, g_min, g_rng, g_rmx, g_nf, g_neg, g_masked, g_peak, g_elig,
                       n_rows, n_cols)


@triton.jit
def _publish_flagged_row(X_row, flag_ptr, F_ptr, I_ptr, n_cols, elig, peak, CHUNK: tl.constexpr):
    """A row with NaN or +inf: its exact statistics (a re-read in CHUNK pieces, float64 squares) merged into
    the workspace as the persistent kernel's exact pass merges them (eligible and peaked are the row's
    own, from its s and t), then the flag on word 1, released after them."""
    sq, nf, nneg, rmax, rmin = _row_stats_chunked(X_row, n_cols, CHUNK)
    p_max, p_min, p_rng, p_rmx = _merge_extremes(rmax, rmin, tl.zeros((), dtype=tl.float32),
                                                 tl.full((), float("inf"), tl.float32), rmax, rmin, F_ptr)
    merge_partials(F_ptr, I_ptr, p_max, p_min, p_rng, p_rmx, sq, nf, nneg, (nneg == n_cols).to(tl.int32), peak, elig,
                   1.0)
    release_flag(flag_ptr)


def softmax_rows_launch(x2: torch.Tensor, y2: torch.Tensor, buf: torch.Tensor, num_warps: int | None = None,
                        maxnreg: int | None = None, poll: int | None = None, prefetch: float | None = None):
    """_softmax_rows_kernel over x2 (rows, n), 16-bit and packable: a program per row and the finisher.
    num_warps / maxnreg / poll / prefetch override the launch (the bench's sweep; poll a power of two)."""
    n_rows, n = x2.shape
    block, warps, _, _ = launch_config("softmax", n, num_warps, None, esize=x2.element_size())
    vec, lanes = lane_shape(block, x2.element_size(), warps)
    kp = min(KEEP, vec)
    cap = maxnreg if maxnreg is not None else MAXNREG.get((block, warps))
    f, i = workspace("softmax", x2.device)
    m = row_records("softmax", x2.device, n_rows, words=2, extra=0)[0]
    key = ("softmax-rows", x2.dtype, y2.dtype, block, warps, cap)
    pf = prefetch_args("softmax", block, x2, True, n_rows + 1, key, prefetch)
    k = launch(_softmax_rows_kernel, (n_rows + 1,),
        x2, x2.stride(0), y2, y2.stride(0), buf, f, i, m, n_rows, n, PEAK_NATS,
        BLOCK=block, VEC=vec, LANES=lanes, KEEP=kp, BF16=x2.dtype == torch.bfloat16, NEG_PAIR=NEG_INF_PAIR[x2.dtype],
        NEG_SAFE=NEG_SAFE[x2.dtype], POLL=poll or RECORD_POLL, CHUNK=min(CHUNK, block), FINISHER_FIRST=not INTERPRETED,
        **pf, num_warps=warps, enable_fp_fusion=True, **register_cap(cap),
    )
    note_occupancy(key, k, warps)
