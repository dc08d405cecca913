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
The sketch rides in the two trees the op already has: the max tree carries (h, h*h, min, -inf
count) (max is exact in any tree) and the sum tree carries t = sum e*(h - m) next to s (s's lanes
and tree are tl.sum's: y is bit-identical with and without the sketch). Per row the entropy of the
softmax row is H = log(s) - t / s (fp32, approximate log); `peaked_frac` counts rows with H below
the catalog's low_entropy_nats among rows with a finite entry and no NaN/+inf. Only rows with
NaN/+inf (or h*h overflow) recompute exact partials after the loop.
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
    "peaked_frac")
assert [n for n, _ in WORKSPACE["softmax"][0]] == ["absmax", "sumsq", "max", "min", "max_row_range"]
assert WORKSPACE["softmax"][1] == ("ticket", "nonfinite", "neginf", "masked_rows", "peaked_rows", "eligible_rows")

# A row is peaked below this entropy (nats); passed to the kernel as a runtime float.
PEAK_NATS = float(DEFAULT_TOLERANCES.low_entropy_nats)
# Sketch partials of the max tree as separate tl.reduce calls (the bench's sweep decides).
SPLIT = False


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
def _exp_sums(h, m):
    """(e = exp(h - m), s = sum e, t = sum e*(h - m) over lanes with e > 0) in one tree; s is the same
    value tl.sum(e) gives (same lanes, same tree, adds only)."""
    d = h - m
    e = tl.exp(d)  # approximate exp; -inf lanes (masks, padding) give 0
    # e == 0 on -inf lanes (0 * -inf would be NaN) and where exp underflows (e*d would be -0 there):
    # testing e instead of h == -inf keeps no per-lane mask alive across the max tree
    ed = tl.where(e > 0.0, e * d, 0.0)
    if INTERPRET:
        s, t = tl.sum(e, 0), tl.sum(ed, 0)
    else:
        s, t = tl.reduce((e, ed), 0, _sum2)
    return e, s, t


@triton.jit
def _peaked(s, t, peak_nats):
    """1 if the row's softmax entropy log(s) - t/s is below peak_nats, else 0 (int64)."""
    return (tl.log(s) - t / s < peak_nats).to(tl.int64)


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
def _softmax_kernel(
    X_ptr,  # x as (n_rows, n_cols) in dtype, last dim contiguous
    X_row_stride,
    Y_ptr,  # y as (n_rows, n_cols) in the output dtype, contiguous
    Y_row_stride,
    S_ptr,  # sketch features, float64 (11,); unused unless SKETCH
    F_ptr,  # workspace float64 slots (absmax, sumsq, max, min, max row range)
    I_ptr,  # workspace int64 slots (ticket, nonfinite, -inf count, masked rows, peaked rows, eligible rows)
    n_rows,
    n_cols,
    peak_nats,  # fp32: entropy below which a row is peaked
    BLOCK: tl.constexpr,
    SKETCH: tl.constexpr,
    STAGES: tl.constexpr,  # loads in flight in the row loop (1: none ahead; >1: async copies)
    SPLIT: tl.constexpr,  # sketch partials as separate trees (fewer live registers) instead of one combined tree
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if SKETCH:
        p_amax = tl.zeros((), dtype=tl.float32)
        p_max = tl.full((), -float("inf"), tl.float32)
        p_min = tl.full((), float("inf"), tl.float32)
        p_rng = tl.zeros((), dtype=tl.float32)
        p_sq = tl.zeros((), dtype=tl.float64)
        p_nf = tl.zeros((), dtype=tl.int64)
        p_neg = tl.zeros((), dtype=tl.int64)
        p_masked = tl.zeros((), dtype=tl.int64)
        p_peak = tl.zeros((), dtype=tl.int64)  # eligible rows with entropy < peak_nats
        p_elig = tl.zeros((), dtype=tl.int64)  # rows with a finite entry and no NaN/+inf
        p_bad = tl.zeros((), dtype=tl.int32)  # rows left to the exact pass after the loop
    for r in tl.range(pid, n_rows, tl.num_programs(0), num_stages=STAGES):
        row = tl.cast(r, tl.int64)
        x = tl.load(X_ptr + row * X_row_stride + cols, mask=mask, other=-float("inf"),
                    eviction_policy="evict_first")  # read n (dtype)
        h = x.to(tl.float32)
        if SKETCH:
            # one tree: the op's max and the sketch's sum of squares (-inf lanes, incl. padding, add
            # 0; NaN/+inf make it non-finite), smallest non-masked entry and the -inf count
            ninf = h == -float("inf")
            q = tl.where(ninf, 0.0, h * h)
            lo = tl.where(ninf, float("inf"), h)
            neg = tl.where(ninf & mask, 1.0, 0.0)
            if INTERPRET or SPLIT:
                m, sq, rmin, nneg = tl.max(h, 0), tl.sum(q, 0), tl.min(lo, 0), tl.sum(neg, 0)
            else:
                m, sq, rmin, nneg = tl.reduce((h, q, lo, neg), 0, _combine4)
            e, s, t = _exp_sums(h, m)
        else:
            m = tl.max(h, axis=0)
            e = tl.exp(h - m)  # approximate exp; padding lanes give exp(-inf) = 0
            s = tl.sum(e, axis=0)  # fp32 tree sum
        y = e / s
        tl.store(Y_ptr + row * Y_row_stride + cols, y.to(Y_ptr.dtype.element_ty), mask=mask,
                 eviction_policy="evict_first")  # write n
        if SKETCH:  # scalars only, so h dies at the store; rows with NaN/+inf wait for the exact pass
            ok = sq <= FMAX  # no NaN/+inf: the max tree's values are the sketch's
            has = ok & (m >= rmin)  # the row has a finite entry
            p_amax = tl.maximum(p_amax, tl.where(has, tl.maximum(m, -rmin), 0.0))
            p_max = tl.maximum(p_max, tl.where(has, m, -float("inf")))
            p_min = tl.minimum(p_min, tl.where(has, rmin, float("inf")))
            p_rng = tl.maximum(p_rng, tl.where(has, m - rmin, 0.0))
            p_sq += tl.where(ok, sq, 0.0).to(tl.float64)
            p_neg += tl.where(ok, nneg, 0.0).to(tl.int64)
            p_masked += (ok & (nneg == n_cols)).to(tl.int64)
            p_elig += has.to(tl.int64)
            p_peak += tl.where(has, _peaked(s, t, peak_nats), 0)
            p_bad += tl.where(ok, 0, 1)
    if SKETCH:
        if p_bad > 0:  # rare: re-read this program's rows that had NaN/+inf (or h*h overflow)
            for r2 in tl.range(pid, n_rows, tl.num_programs(0)):
                h2 = tl.load(X_ptr + tl.cast(r2, tl.int64) * X_row_stride + cols, mask=mask,
                             other=-float("inf")).to(tl.float32)
                ninf2 = h2 == -float("inf")
                if not (tl.sum(tl.where(ninf2, 0.0, h2 * h2), axis=0) <= FMAX):  # the loop's test
                    amax, sq2, nf, rmax, rmin2 = _exact_row(h2, mask)
                    nneg2 = tl.sum(tl.where(ninf2 & mask, 1.0, 0.0), axis=0)
                    has2 = rmax >= rmin2
                    p_amax = tl.maximum(p_amax, amax)
                    p_max = tl.maximum(p_max, rmax)
                    p_min = tl.minimum(p_min, rmin2)
                    p_rng = tl.maximum(p_rng, tl.where(has2, rmax - rmin2, 0.0))
                    p_sq += sq2.to(tl.float64)
                    p_nf += tl.cast(nf, tl.int64)
                    p_neg += nneg2.to(tl.int64)
                    p_masked += (nneg2 == n_cols).to(tl.int64)
                    if (nf == 0) & has2:  # finite entries only, squares overflowed: still eligible
                        _, s2, t2 = _exp_sums(h2, rmax)
                        p_elig += 1
                        p_peak += _peaked(s2, t2, peak_nats)
    if SKETCH:
        tl.atomic_max(F_ptr + 0, p_amax.to(tl.float64), sem="relaxed")
        tl.atomic_add(F_ptr + 1, p_sq, sem="relaxed")
        tl.atomic_max(F_ptr + 2, p_max.to(tl.float64), sem="relaxed")
        tl.atomic_min(F_ptr + 3, p_min.to(tl.float64), sem="relaxed")
        tl.atomic_max(F_ptr + 4, p_rng.to(tl.float64), sem="relaxed")
        tl.atomic_add(I_ptr + 1, p_nf, sem="relaxed")
        tl.atomic_add(I_ptr + 2, p_neg, sem="relaxed")
        tl.atomic_add(I_ptr + 3, p_masked, sem="relaxed")
        tl.atomic_add(I_ptr + 4, p_peak, sem="relaxed")
        tl.atomic_add(I_ptr + 5, p_elig, sem="relaxed")
        if last_program(I_ptr):
            g_amax = take(F_ptr + 0, ZERO_BITS)
            g_sq = take(F_ptr + 1, ZERO_BITS)
            g_max = take(F_ptr + 2, NEG_INF_BITS)
            g_min = take(F_ptr + 3, POS_INF_BITS)
            g_rng = take(F_ptr + 4, ZERO_BITS)
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


def _softmax_launch(
    x2: torch.Tensor, y2: torch.Tensor, buf: torch.Tensor | None, num_warps: int | None = None,
    stages: int | None = None, per_sm: int | None = None, split: bool | None = None,
) -> None:
    """Grid: one persistent program per resident slot (persistent_grid), each over its share of rows.
    num_warps / stages / per_sm override the tuned launch (the bench's sweep)."""
    n_rows, n = x2.shape
    sketch = buf is not None
    if n_rows == 0 and not sketch:
        return
    block, warps, st = launch_config("softmax", n, num_warps, stages)
    f, i = workspace("softmax", x2.device) if sketch else (y2, y2)
    sp = SPLIT if split is None else split
    key = ("softmax", x2.dtype, y2.dtype, block, warps, st, sp, sketch)
    k = _softmax_kernel[(persistent_grid(key, n_rows, x2.device, per_sm),)](
        x2, x2.stride(0), y2, y2.stride(0), buf if sketch else y2, f, i, n_rows, n, PEAK_NATS,
        BLOCK=block, SKETCH=sketch, STAGES=st, SPLIT=sp, num_warps=warps, enable_fp_fusion=False,
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
