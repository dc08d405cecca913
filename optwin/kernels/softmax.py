"""Softmax over the last dim in Triton, with the input sketch in the same pass (softmax/triton).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.softmax import softmax; \
print(softmax(torch.randn(2, 5))[0])"

Numerics (what optwin.twin's softmax/triton models), per row of n elements:
    h = x.float()               # exact; -inf marks masked positions
    m = tl.max(h)               # exact
    e = exp(h - m)              # fp32 subtraction; tl.exp is approximate, like __expf
                                # (ex2.approx.f32 of (h-m)*log2(e) on NVIDIA); numpy exp in the interpreter
    s = tl.sum(e)               # fp32 reduction tree
    y = (e / s).to(out dtype)   # fp32 division (div.full.f32 on NVIDIA, ~2 ulp), one rounding
A fully masked row gives m = -inf, h - m = NaN: y is NaN, as torch.softmax gives.
Compiled without FMA contraction (enable_fp_fusion=False: nothing in y's path is a mul feeding an
add, so y's numerics are unchanged by it; it keeps the sketch's extra products from being fused
into any shared instruction).
The sketch rides in the two trees the op already has (layout VARIANT 3, the default): the max
tree carries (h, h*h, min, -inf count) over non-(-inf) lanes (max is exact in any tree; the -inf
count includes the BLOCK - n padding lanes and subtracts them) and the sum tree carries
t = sum e * max(h - m, -FMAX) next to s (s's lanes and tree are tl.sum's: y is bit-identical with
and without the sketch; a lane with e == 0 adds -0 to t). Per row the entropy of the softmax row is
H = log(s) - t / s (fp32, approximate log); `peaked_frac` counts rows with H below the catalog's
low_entropy_nats among rows with a finite entry and no NaN/+inf. Per-row sums of squares are fp32
trees, summed over rows in float64. A row with NaN/+inf or a finite |h| >= BIG (2**55, where squares
could overflow) takes the slow path after the loop: it is re-read in CHUNK-column pieces (exact
max/min/counts, float64 sum of squares, chunk-ordered fp32 entropy sums for a finite row).
Launch: BLOCK = next_pow2(n); warps and stages from _common.TUNED (16 warps at BLOCK 16384, measured).
Memory: read rows*n (x), write rows*n (y, in x's dtype or the requested out dtype); persistent
programs; with the sketch a few scalar atomics per program and the feature vector.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.catalog import DEFAULT_TOLERANCES
from optwin.kernels._common import (
    FMAX,
    INTERPRET,
    NEG_INF_BITS,
    POS_INF_BITS,
    ZERO_BITS,
    check_device,
    last_program,
    launch_config,
    note_occupancy,
    persistent_grid,
    rows_view,
    take,
)
from optwin.kernels.sketch_buffer import WORKSPACE, feature_names, new_buffer, workspace

assert feature_names("softmax") == (
    "numel", "rows", "absmax", "rms", "nonfinite", "n", "max", "min", "max_row_range", "masked_rows", "masked_frac",
    "peaked_frac",
    "min_row_max")
assert [n for n, _ in WORKSPACE["softmax"][0]] == ["absmax", "sumsq", "max", "min", "max_row_range", "min_row_max"]
assert WORKSPACE["softmax"][1] == ("ticket", "nonfinite", "neginf", "masked_rows", "peaked_rows", "eligible_rows")

# A row is peaked below this entropy (nats); passed to the kernel as a runtime float.
PEAK_NATS = float(DEFAULT_TOLERANCES.low_entropy_nats)
# Sketch partials of the max tree as separate tl.reduce calls (the bench's sweep decides).
SPLIT = False
# Finite |h| at or above this goes to the slow path (VARIANT >= 1): below it a row's fp32 sum of
# squares cannot overflow (2**16 lanes * 2**110 < FMAX), so the main loop's test is lane-wise exact.
BIG: tl.constexpr = tl.constexpr(2.0**55)
# Sketch layouts (VARIANT), timed against each other by bench/softmax_sketch.py
# (bench/results/softmax_sketch_h200.md, 4096x16384 bf16, µs without / with the sketch):
#   0: max tree carries (h, h*h, min, -inf count), sum tree (s, t); full-row exact pass for NaN/+inf
#      rows in the same kernel, whose registers set the kernel's (90 at 16 warps: 1 program per SM).
#      32 warps 81.1/144.2, 16 warps 82.0/178.0 (the layout before issue #6)
#   1: as 0, the slow path re-reads rows in CHUNK pieces (64 registers at 16 warps: 2 programs per
#      SM) and sums squares in float64. 16 warps 82.1/125.0; 32 warps 81.7/144.8
#   2: max tree carries (h, min), sum tree (s, t, h*h, -inf count); slow path as 1. More registers
#      (e and h live across the sum tree): 16 warps 81.5/167.5
#   3: as 1 with fewer instructions per lane (t's lanes e * max(d, -FMAX) instead of a compare and
#      select; the -inf count includes padding: no column mask in the loop). 16 warps 82.1/121.7;
#      32 warps 81.8/146.4; 8 warps 88.0/142.6; 16 warps 2 stages 86.3/176.3
# With 2 programs per SM the sketch is instruction-bound: its main loop issues ~2x the op's
# instructions (17 extra per element: the square, min, -inf count and t lanes and their adds).
VARIANT = 3
CHUNK = 256  # slow-path piece: no register spill at 16 warps (512 and up: an 8-byte stack frame)


@triton.jit
def _combine4(a0, a1, a2, a3, b0, b1, b2, b3):
    return tl.maximum(a0, b0), a1 + b1, tl.minimum(a2, b2), a3 + b3


@triton.jit
def _combine6(a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5):
    return tl.maximum(a0, b0), a1 + b1, a2 + b2, tl.maximum(a3, b3), tl.minimum(a4, b4), a5 + b5


@triton.jit
def _sum2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _max_min(a0, a1, b0, b1):
    return tl.maximum(a0, b0), tl.minimum(a1, b1)


@triton.jit
def _sum4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _exp_sums(h, m):
    """(e = exp(h - m), s = sum e, t = sum e*(h - m) over lanes with e > 0) in one tree; s is the same
    value tl.sum(e) gives (same lanes, same tree, adds only)."""
    d = h - m
    e = tl.exp(d)  # approximate exp; -inf lanes (masks, padding) give 0
    # e == 0 on -inf lanes (0 * -inf would be NaN) and where exp underflows (e*d would be -0 there):
    # testing e instead of h == -inf keeps no per-lane mask alive across the max tree
    ed = tl.where(e > 0.0, e * d, 0.0)
    s, t = _sum_pair(e, ed)
    return e, s, t


@triton.jit
def _sum_pair(e, ed):
    """(sum e, sum ed) in one tree (two trees in the interpreter, which has no tuple reduce)."""
    if INTERPRET:
        return tl.sum(e, 0), tl.sum(ed, 0)
    else:
        return tl.reduce((e, ed), 0, _sum2)


@triton.jit
def _exp_sums_clamped(h, m):
    """_exp_sums with t's lanes as e * max(d, -FMAX): the same values (a lane with e == 0 adds -0
    instead of 0; -inf lanes give 0 * -FMAX, not NaN) with one instruction less per lane."""
    d = h - m
    e = tl.exp(d)
    ed = e * tl.maximum(d, -FMAX)
    s, t = _sum_pair(e, ed)
    return e, s, t


@triton.jit
def _exp_sums_sq(h, m, PAD: tl.constexpr):
    """_exp_sums plus the sketch's per-row sum of squares q (h*h over non-(-inf) lanes: NaN/+inf make
    it non-finite) and -inf count in the SAME sum tree: (e, s, t, q, -inf count). PAD = padding lanes
    (all -inf), subtracted from the count so no column mask stays alive. s is tl.sum(e)'s value."""
    d = h - m
    e = tl.exp(d)
    ed = tl.where(e > 0.0, e * d, 0.0)
    ninf = h == -float("inf")
    q = tl.where(ninf, 0.0, h * h)
    neg = tl.where(ninf, 1.0, 0.0)  # exact in fp32 (BLOCK <= 2**16)
    if INTERPRET:
        s, t, sq, nneg = tl.sum(e, 0), tl.sum(ed, 0), tl.sum(q, 0), tl.sum(neg, 0)
    else:
        s, t, sq, nneg = tl.reduce((e, ed, q, neg), 0, _sum4)
    return e, s, t, sq, nneg - PAD


@triton.jit
def _peaked(s, t, peak_nats):
    """1 if the row's softmax entropy log(s) - t/s is below peak_nats, else 0 (int32)."""
    return (tl.log(s) - t / s < peak_nats).to(tl.int32)


@triton.jit
def _exact_row(h, mask):
    """Slow path (a row with NaN/+inf): (absmax, sumsq, nonfinite, max, min) over finite entries."""
    ah = tl.abs(h)
    fin = mask & (ah <= FMAX)
    a = tl.where(fin, ah, 0.0)
    nf = tl.where(fin | (h < -FMAX), 0.0, tl.where(mask, 1.0, 0.0))  # NaN, +inf
    hi = tl.where(fin, h, -float("inf"))
    lo = tl.where(fin, h, float("inf"))
    if INTERPRET:
        return tl.max(a, 0), tl.sum(a * a, 0), tl.sum(nf, 0), tl.max(hi, 0), tl.min(lo, 0)
    else:
        amax, sq, nonfin, rmax, rmin, _ = tl.reduce((a, a * a, nf, hi, lo, nf), 0, _combine6)
        return amax, sq, nonfin, rmax, rmin


@triton.jit
def _exact_row_chunked(X_row, n_cols, peak_nats, CHUNK: tl.constexpr):
    """Slow path (a row with NaN/+inf or a finite |h| >= BIG), re-read in CHUNK-column pieces so it
    adds few registers to the kernel: (sumsq (float64), nonfinite, -inf count, max, min,
    eligible, peaked) over the row. The entropy sums are chunk-ordered fp32 (only the peaked test
    reads them)."""
    sq = tl.zeros((), dtype=tl.float64)
    nf = tl.zeros((), dtype=tl.int64)
    nneg = tl.zeros((), dtype=tl.int64)
    rmax = tl.full((), -float("inf"), tl.float32)
    rmin = tl.full((), float("inf"), tl.float32)
    for c in tl.range(0, n_cols, CHUNK):
        cc = c + tl.arange(0, CHUNK)
        cm = cc < n_cols
        h = tl.load(X_row + cc, mask=cm, other=-float("inf")).to(tl.float32)
        ah = tl.abs(h)
        fin = ah <= FMAX  # padding is -inf: never finite
        a = tl.where(fin, ah, 0.0)
        a64 = a.to(tl.float64)
        sq += tl.sum(a64 * a64, 0)
        nf += tl.sum(tl.where(fin | (h < -FMAX) | (~cm), 0, 1), 0).to(tl.int64)  # NaN, +inf
        nneg += tl.sum(tl.where(cm & (h == -float("inf")), 1, 0), 0).to(tl.int64)
        rmax = tl.maximum(rmax, tl.max(tl.where(fin, h, -float("inf")), 0))
        rmin = tl.minimum(rmin, tl.min(tl.where(fin, h, float("inf")), 0))
    has = rmax >= rmin
    elig = (nf == 0) & has  # finite entries only (squares overflowed): still eligible
    peak = tl.zeros((), dtype=tl.int32)
    if elig:
        s = tl.zeros((), dtype=tl.float32)
        t = tl.zeros((), dtype=tl.float32)
        for c in tl.range(0, n_cols, CHUNK):
            cc = c + tl.arange(0, CHUNK)
            h = tl.load(X_row + cc, mask=cc < n_cols, other=-float("inf")).to(tl.float32)
            d = h - rmax
            e = tl.exp(d)
            s += tl.sum(e, 0)
            t += tl.sum(tl.where(e > 0.0, e * d, 0.0), 0)
        peak = _peaked(s, t, peak_nats)
    return sq, nf, nneg, rmax, rmin, elig.to(tl.int32), peak


@triton.jit
def _row_is_slow(X_row, n_cols, CHUNK: tl.constexpr):
    """The main loop's `ok` test, lane by lane: True if the row has a NaN, +inf or finite |h| >= BIG."""
    nbad = tl.zeros((), dtype=tl.int32)
    for c in tl.range(0, n_cols, CHUNK):
        cc = c + tl.arange(0, CHUNK)
        h = tl.load(X_row + cc, mask=cc < n_cols, other=-float("inf")).to(tl.float32)
        bad = (h != -float("inf")) & ~(tl.abs(h) < BIG)  # NaN compares false
        nbad += tl.sum(bad.to(tl.int32), 0)
    return nbad > 0


@triton.jit
def _merge_extremes(p_max, p_min, p_rng, p_rmx, rmax, rmin):
    """A slow-path row's finite max and min merged into the program's max, min, widest row range and
    smallest row max (a row without a finite entry has rmax = -inf < rmin = +inf and adds nothing)."""
    has = rmax >= rmin
    return (tl.maximum(p_max, rmax), tl.minimum(p_min, rmin), tl.maximum(p_rng, tl.where(has, rmax - rmin, 0.0)),
            tl.minimum(p_rmx, tl.where(has, rmax, float("inf"))))


@triton.jit
def _softmax_kernel(
    X_ptr,  # x as (n_rows, n_cols) in dtype, last dim contiguous
    X_row_stride,
    Y_ptr,  # y as (n_rows, n_cols) in the output dtype, contiguous
    Y_row_stride,
    S_ptr,  # sketch features, float64 (11,); unused unless SKETCH
    F_ptr,  # workspace float64 slots (absmax, sumsq, max, min, max row range, min row max)
    I_ptr,  # workspace int64 slots (ticket, nonfinite, -inf count, masked rows, peaked rows, eligible rows)
    n_rows,
    n_cols,
    peak_nats,  # fp32: entropy below which a row is peaked
    BLOCK: tl.constexpr,
    SKETCH: tl.constexpr,
    STAGES: tl.constexpr,  # loads in flight in the row loop (1: none ahead; >1: async copies)
    SPLIT: tl.constexpr,  # sketch partials of the max tree as separate trees instead of one combined tree
    VARIANT: tl.constexpr,  # sketch layout (see VARIANT above); 0 without SKETCH
    CHUNK: tl.constexpr,  # columns per piece of the chunked slow path (VARIANT >= 1)
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if SKETCH:
        p_max = tl.full((), -float("inf"), tl.float32)
        p_min = tl.full((), float("inf"), tl.float32)
        p_rng = tl.zeros((), dtype=tl.float32)
        p_rmx = tl.full((), float("inf"), tl.float32)  # smallest row max (rows with a finite entry)
        p_sq = tl.zeros((), dtype=tl.float64)
        p_nf = tl.zeros((), dtype=tl.int64)
        p_neg = tl.zeros((), dtype=tl.int64)
        # row counts in int32 (fewer loop-carried registers; < 2**31 rows); absmax is max(p_max, -p_min)
        p_masked = tl.zeros((), dtype=tl.int32)
        p_peak = tl.zeros((), dtype=tl.int32)  # eligible rows with entropy < peak_nats
        p_elig = tl.zeros((), dtype=tl.int32)  # rows with a finite entry and no NaN/+inf
        p_bad = tl.zeros((), dtype=tl.int32)  # rows left to the exact pass after the loop
    for r in tl.range(pid, n_rows, tl.num_programs(0), num_stages=STAGES):
        row = tl.cast(r, tl.int64)
        x = tl.load(X_ptr + row * X_row_stride + cols, mask=mask, other=-float("inf"),
                    eviction_policy="evict_first")  # read n (dtype)
        h = x.to(tl.float32)
        if SKETCH:
            if VARIANT == 2:
                # max tree: (max, min over non-(-inf) lanes); sum tree: (s, t, sum of squares, -inf count)
                lo = tl.where(h == -float("inf"), float("inf"), h)
                if INTERPRET or SPLIT:
                    m, rmin = tl.max(h, 0), tl.min(lo, 0)
                else:
                    m, rmin = tl.reduce((h, lo), 0, _max_min)
                e, s, t, sq, nneg = _exp_sums_sq(h, m, BLOCK - n_cols)
            else:
                # one tree: the op's max and the sketch's sum of squares (-inf lanes, incl. padding, add
                # 0; NaN/+inf make it non-finite), smallest non-masked entry and the -inf count
                ninf = h == -float("inf")
                q = tl.where(ninf, 0.0, h * h)
                lo = tl.where(ninf, float("inf"), h)
                if VARIANT == 3:  # count padding too and subtract it: no column mask in the loop
                    neg = tl.where(ninf, 1.0, 0.0)
                else:
                    neg = tl.where(ninf & mask, 1.0, 0.0)
                if INTERPRET or SPLIT:
                    m, sq, rmin, nneg = tl.max(h, 0), tl.sum(q, 0), tl.min(lo, 0), tl.sum(neg, 0)
                else:
                    m, sq, rmin, nneg = tl.reduce((h, q, lo, neg), 0, _combine4)
                if VARIANT == 3:
                    nneg -= BLOCK - n_cols
                    e, s, t = _exp_sums_clamped(h, m)
                else:
                    e, s, t = _exp_sums(h, m)
        else:
            m = tl.max(h, axis=0)
            e = tl.exp(h - m)  # approximate exp; padding lanes give exp(-inf) = 0
            s = tl.sum(e, axis=0)  # fp32 tree sum
        y = e / s
        tl.store(Y_ptr + row * Y_row_stride + cols, y.to(Y_ptr.dtype.element_ty), mask=mask,
                 eviction_policy="evict_first")  # write n
        if SKETCH:  # scalars only, so h dies at the store; rows with NaN/+inf wait for the exact pass
            if VARIANT == 0:
                ok = sq <= FMAX  # no NaN/+inf: the max tree's values are the sketch's
            else:  # and every finite |h| < BIG (squares cannot overflow): a test _row_is_slow repeats
                ok = (sq <= FMAX) & (tl.maximum(m, -rmin) < BIG)
            has = ok & (m >= rmin)  # the row has a finite entry
            p_max = tl.maximum(p_max, tl.where(has, m, -float("inf")))
            p_min = tl.minimum(p_min, tl.where(has, rmin, float("inf")))
            p_rng = tl.maximum(p_rng, tl.where(has, m - rmin, 0.0))
            p_rmx = tl.minimum(p_rmx, tl.where(has, m, float("inf")))
            p_sq += tl.where(ok, sq, 0.0).to(tl.float64)
            p_neg += tl.where(ok, nneg, 0.0).to(tl.int64)
            p_masked += (ok & (nneg == n_cols)).to(tl.int32)
            p_elig += has.to(tl.int32)
            p_peak += tl.where(has, _peaked(s, t, peak_nats), 0)
            p_bad += tl.where(ok, 0, 1)
    if SKETCH:
        if VARIANT != 0:
            if p_bad > 0:  # rare: re-read this program's slow rows in CHUNK pieces
                for r2 in tl.range(pid, n_rows, tl.num_programs(0)):
                    X_row = X_ptr + tl.cast(r2, tl.int64) * X_row_stride
                    if _row_is_slow(X_row, n_cols, CHUNK):
                        sq2, nf, nneg2, rmax, rmin2, elig2, peak2 = _exact_row_chunked(
                            X_row, n_cols, peak_nats, CHUNK)
                        p_max, p_min, p_rng, p_rmx = _merge_extremes(p_max, p_min, p_rng, p_rmx, rmax, rmin2)
                        p_sq += sq2
                        p_nf += nf
                        p_neg += nneg2
                        p_masked += (nneg2 == n_cols).to(tl.int32)
                        p_elig += elig2
                        p_peak += peak2
        else:
            if p_bad > 0:  # rare: re-read this program's rows that had NaN/+inf (or h*h overflow)
                for r2 in tl.range(pid, n_rows, tl.num_programs(0)):
                    h2 = tl.load(X_ptr + tl.cast(r2, tl.int64) * X_row_stride + cols, mask=mask,
                                 other=-float("inf")).to(tl.float32)
                    ninf2 = h2 == -float("inf")
                    if not (tl.sum(tl.where(ninf2, 0.0, h2 * h2), axis=0) <= FMAX):  # the loop's test
                        _, sq2, nf, rmax, rmin2 = _exact_row(h2, mask)
                        nneg2 = tl.sum(tl.where(ninf2 & mask, 1.0, 0.0), axis=0)
                        has2 = rmax >= rmin2
                        p_max, p_min, p_rng, p_rmx = _merge_extremes(p_max, p_min, p_rng, p_rmx, rmax, rmin2)
                        p_sq += sq2.to(tl.float64)
                        p_nf += tl.cast(nf, tl.int64)
                        p_neg += nneg2.to(tl.int64)
                        p_masked += (nneg2 == n_cols).to(tl.int32)
                        if (nf == 0) & has2:  # finite entries only, squares overflowed: still eligible
                            _, s2, t2 = _exp_sums(h2, rmax)
                            p_elig += 1
                            p_peak += _peaked(s2, t2, peak_nats)
    if SKETCH:
        p_amax = tl.maximum(tl.maximum(p_max, -p_min), 0.0)  # largest finite |h| (0 if none)
        tl.atomic_max(F_ptr + 0, p_amax.to(tl.float64), sem="relaxed")
        tl.atomic_add(F_ptr + 1, p_sq, sem="relaxed")
        tl.atomic_max(F_ptr + 2, p_max.to(tl.float64), sem="relaxed")
        tl.atomic_min(F_ptr + 3, p_min.to(tl.float64), sem="relaxed")
        tl.atomic_max(F_ptr + 4, p_rng.to(tl.float64), sem="relaxed")
        tl.atomic_min(F_ptr + 5, p_rmx.to(tl.float64), sem="relaxed")
        tl.atomic_add(I_ptr + 1, p_nf, sem="relaxed")
        tl.atomic_add(I_ptr + 2, p_neg, sem="relaxed")
        tl.atomic_add(I_ptr + 3, p_masked.to(tl.int64), sem="relaxed")
        tl.atomic_add(I_ptr + 4, p_peak.to(tl.int64), sem="relaxed")
        tl.atomic_add(I_ptr + 5, p_elig.to(tl.int64), sem="relaxed")
        if last_program(I_ptr):
            g_amax = take(F_ptr + 0, ZERO_BITS)
            g_sq = take(F_ptr + 1, ZERO_BITS)
            g_max = take(F_ptr + 2, NEG_INF_BITS)
            g_min = take(F_ptr + 3, POS_INF_BITS)
            g_rng = take(F_ptr + 4, ZERO_BITS)
            g_rmx = take(F_ptr + 5, POS_INF_BITS)
            g_nf = tl.atomic_xchg(I_ptr + 1, 0, sem="relaxed")
            g_neg = tl.atomic_xchg(I_ptr + 2, 0, sem="relaxed")
            g_masked = tl.atomic_xchg(I_ptr + 3, 0, sem="relaxed")
            g_peak = tl.atomic_xchg(I_ptr + 4, 0, sem="relaxed")
            g_elig = tl.atomic_xchg(I_ptr + 5, 0, sem="relaxed")
            tl.atomic_xchg(I_ptr + 0, 0, sem="relaxed")
            numel = tl.cast(n_rows, tl.int64) * n_cols
            cnt = tl.maximum(numel - g_nf - g_neg, 1).to(tl.float64)
            any_fin = g_max >= g_min
            tl.store(S_ptr + 0, numel.to(tl.float64))
            tl.store(S_ptr + 1, tl.cast(n_rows, tl.float64))
            tl.store(S_ptr + 2, g_amax)
            tl.store(S_ptr + 3, tl.sqrt(g_sq / cnt))
            tl.store(S_ptr + 4, g_nf.to(tl.float64))
            tl.store(S_ptr + 5, tl.cast(n_cols, tl.float64))
            tl.store(S_ptr + 6, tl.where(any_fin, g_max, 0.0))
            tl.store(S_ptr + 7, tl.where(any_fin, g_min, 0.0))
            tl.store(S_ptr + 8, g_rng)
            tl.store(S_ptr + 9, g_masked.to(tl.float64))
            tl.store(S_ptr + 10, g_neg.to(tl.float64) / tl.maximum(numel, 1).to(tl.float64))
            tl.store(S_ptr + 11, g_peak.to(tl.float64) / tl.maximum(g_elig, 1).to(tl.float64))
            tl.store(S_ptr + 12, tl.where(any_fin, g_rmx, 0.0))


def _softmax_launch(
    x2: torch.Tensor, y2: torch.Tensor, buf: torch.Tensor | None, num_warps: int | None = None,
    stages: int | None = None, per_sm: int | None = None, split: bool | None = None,
    variant: int | None = None,
) -> None:
    """Grid: one persistent program per resident slot (persistent_grid), each over its share of rows.
    num_warps / stages / per_sm / split / variant override the tuned launch (the bench's sweep)."""
    n_rows, n = x2.shape
    sketch = buf is not None
    if n_rows == 0 and not sketch:
        return
    block, warps, st = launch_config("softmax", n, num_warps, stages)
    f, i = workspace("softmax", x2.device) if sketch else (y2, y2)
    sp = SPLIT if split is None else split
    var = (VARIANT if variant is None else variant) if sketch else 0  # no sketch: one kernel
    key = ("softmax", x2.dtype, y2.dtype, block, warps, st, sp, sketch, var)
    k = _softmax_kernel[(persistent_grid(key, n_rows, x2.device, per_sm),)](
        x2, x2.stride(0), y2, y2.stride(0), buf if sketch else y2, f, i, n_rows, n, PEAK_NATS,
        BLOCK=block, SKETCH=sketch, STAGES=st, SPLIT=sp, VARIANT=var,
        CHUNK=min(CHUNK, block), num_warps=warps, enable_fp_fusion=False,
    )
    note_occupancy(key, k, warps)


def softmax(
    x: torch.Tensor, sketch: bool = True, out_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(softmax of x over the last dim, sketch features or None); y in out_dtype (default x's dtype).

    Read the features with optwin.kernels.read_sketch("softmax", buf).
    """
    check_device(x)
    x2 = rows_view(x)  # (rows, n)
    y2 = torch.empty(x2.shape, dtype=out_dtype or x.dtype, device=x.device)  # (rows, n)
    buf = new_buffer("softmax", x.device) if sketch else None
    _softmax_launch(x2, y2, buf)
    return y2.reshape(x.shape), buf
