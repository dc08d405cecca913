"""layernorm's sketch pieces that its kernels share (optwin.kernels.layernorm's row-in-registers and
chunked kernels, optwin.kernels.layernorm_welford): a row's |mean|/std, the constant-row test, the
exact float64 partials of a row the fast path cannot summarize, the parameters' features, and the
persistent kernels' merge into the workspace.

    python -c "import optwin.kernels.layernorm_sketch as s; print(s.SUSPECT)"
"""

from __future__ import annotations

import triton
import triton.language as tl

from optwin.kernels._common import (
    FMAX,
    finish_norm_sketch,
    finite_partials,
    finite_partials_chunked,
    last_program,
    read_slot,
)

# A row whose |mean|/std reaches 2^16 (or whose var is 0) is tested for being constant: m*m >= var * SUSPECT.
SUSPECT: tl.constexpr = tl.constexpr(2.0**32)


@triton.jit
def _ratio(mf, sf, cabs, cap):
    """|mean|/std of a row capped at `cap` (`cap` when std == 0 and mean != 0); 0 for a constant
    row (cabs >= 0: its |c| goes to const_absmax instead)."""
    am = tl.abs(mf)
    ratio = tl.minimum(tl.where(sf > 0, am / sf, tl.where(am > 0, cap, 0.0)), cap)
    return tl.where(cabs >= 0.0, 0.0, ratio)


@triton.jit
def _could_be_constant(m, var):
    """A constant row has every d = c - m equal: var = d*d with |m|/std >= ~2^20 (m is c to a few
    ulps), or var = 0. Rows past |m|/std = 2^16 (or var = 0) are tested exactly after the loop."""
    return (var == 0.0) | (m * m >= var * SUSPECT)


@triton.jit
def _const_of(hmax, hmin):
    """|c| of a row whose finite max equals its finite min (a constant row: exact, as ingest tests it),
    else -1.0 (also for a row with no finite entry: -inf != inf)."""
    return tl.where(hmax == hmin, tl.abs(hmax), -1.0)


@triton.jit
def _const_abs(X_row, cols, n_cols, m, var, CHUNK: tl.constexpr):
    """The chunked kernel's per-row test: _const_of the row if it could be constant, else -1.0. Only
    rows that could be constant pay: the row is read again (L2) in CHUNK pieces inside the branch."""
    cabs = tl.full((), -1.0, tl.float32)
    if _could_be_constant(m, var):  # m, var finite here: the row has no NaN/±inf
        hmax = tl.full((), -float("inf"), tl.float32)
        hmin = tl.full((), float("inf"), tl.float32)
        for c0 in tl.range(0, n_cols, CHUNK):
            cm = c0 + cols < n_cols
            h = tl.load(X_row + c0 + cols, mask=cm, other=0.0).to(tl.float32)
            hmax = tl.maximum(hmax, tl.max(tl.where(cm, h, -float("inf")), axis=0))
            hmin = tl.minimum(hmin, tl.min(tl.where(cm, h, float("inf")), axis=0))
        cabs = _const_of(hmax, hmin)
    return cabs


@triton.jit
def _merge_row(p_amax, p_ratio, p_minstd, p_sq, p_nf, p_const, amax, sq, nf, mf, sf, cabs, cap):
    """One row's sketch partials (absmax, sum of squares, non-finite count, mean, std, constant |c|)
    merged into the program's."""
    return (tl.maximum(p_amax, amax), tl.maximum(p_ratio, _ratio(mf, sf, cabs, cap)), tl.minimum(p_minstd, sf),
            p_sq + sq.to(tl.float64), p_nf + nf.to(tl.int64), tl.maximum(p_const, cabs))


@triton.jit
def _slot_partials(sl_m, sl_var, valid, n_cols, cap):
    """Sketch partials of up to LANES rows held one per lane (mean, variance), computed lane-parallel:
    (max ratio, min std, float64 sum of squares, rows left to the pass after the loop) over the `valid`
    lanes whose row is finite (sq = n * (var + mean^2) <= FMAX). Rows that could be constant leave
    their ratio to that pass, and so do rows with NaN/±inf or overflow (all of their partials)."""
    sq = (sl_var + sl_m * sl_m) * n_cols  # = sum h*h over the row, from the two sums already done
    ok = valid & (sq <= FMAX)  # every entry finite (NaN/±inf make mean, var NaN)
    sf = tl.sqrt(sl_var)
    later = ok & _could_be_constant(sl_m, sl_var)
    ratio = _ratio(sl_m, sf, tl.where(later, 0.0, -1.0), cap)  # 0 for the rows tested later
    return (tl.max(tl.where(ok, ratio, 0.0), 0), tl.min(tl.where(ok, sf, float("inf")), 0),
            tl.sum(tl.where(ok, sq, 0.0).to(tl.float64), 0), tl.sum(((valid & ~ok) | later).to(tl.int32), 0))


@triton.jit
def _param_features(W_ptr, B_ptr, S_ptr, cols, n_cols, BLOCK: tl.constexpr):
    """Store the weight and bias features (largest finite |w|, |b|), BLOCK at a time; returns their
    NaN/±inf count (int64). Also the whole-row kernel's form (one piece there): taking w and b whole
    instead left it 368 bytes of spills at 8 warps / 128 registers (760 at 4 warps):
    bench/offline_compile.py, triton 3.9."""
    wmax, _, wnf = finite_partials_chunked(W_ptr, cols, n_cols, BLOCK)
    bmax, _, bnf = finite_partials_chunked(B_ptr, cols, n_cols, BLOCK)
    tl.store(S_ptr + 8, wmax.to(tl.float64))
    tl.store(S_ptr + 9, bmax.to(tl.float64))
    return (wnf + bnf).to(tl.int64)


@triton.jit
def _param_partials(W_ptr, B_ptr, S_ptr, I_ptr, cols, n_cols, BLOCK: tl.constexpr):
    """_param_features, their NaN/±inf count merged into the workspace."""
    tl.atomic_add(I_ptr + 2, _param_features(W_ptr, B_ptr, S_ptr, cols, n_cols, BLOCK), sem="relaxed")


@triton.jit
def _store_own_features(S_ptr, g_ratio, g_minstd, g_const, n_rows, CAP: tl.constexpr):
    """layernorm's own features after the shared head: max |mean|/std (exactly CAP once capped: the
    fp32 cap rounds up), min row std (0 without rows), largest constant |c| (0 without one)."""
    cap64 = tl.full((), CAP, tl.float64)
    tl.store(S_ptr + 6, tl.where(g_ratio >= cap64, cap64, g_ratio))
    tl.store(S_ptr + 7, tl.where(n_rows > 0, g_minstd, 0.0))
    tl.store(S_ptr + 10, g_const)


@triton.jit
def _merge_partials(F_ptr, I_ptr, p_amax, p_sq, p_ratio, p_minstd, p_nf, p_const):
    """Partials (absmax, float64 sum of squares, max |mean|/std, min std, NaN/±inf count (int64),
    constant |c| or below 0) merged into the workspace's slots (relaxed scalar atomics)."""
    tl.atomic_max(F_ptr + 0, p_amax.to(tl.float64), sem="relaxed")
    tl.atomic_add(F_ptr + 1, p_sq, sem="relaxed")
    tl.atomic_max(F_ptr + 2, p_ratio.to(tl.float64), sem="relaxed")
    tl.atomic_min(F_ptr + 3, p_minstd.to(tl.float64), sem="relaxed")
    tl.atomic_max(F_ptr + 4, tl.maximum(p_const, 0.0).to(tl.float64), sem="relaxed")
    tl.atomic_add(I_ptr + 1, p_nf, sem="relaxed")


@triton.jit
def _publish(S_ptr, F_ptr, I_ptr, p_amax, p_sq, p_ratio, p_minstd, p_nf, p_const, n_rows, n_cols, CAP: tl.constexpr):
    """Merge one program's sketch partials into the workspace; the last program writes the features."""
    _merge_partials(F_ptr, I_ptr, p_amax, p_sq, p_ratio, p_minstd, p_nf, p_const)
    if last_program(I_ptr):
        g_ratio = read_slot(F_ptr + 2)
        g_minstd = read_slot(F_ptr + 3)
        g_const = read_slot(F_ptr + 4)
        finish_norm_sketch(S_ptr, F_ptr, I_ptr, n_rows, n_cols)
        _store_own_features(S_ptr, g_ratio, g_minstd, g_const, n_rows, CAP)


@triton.jit
def _chunked_exact_row(X_row, cols, n_cols, CHUNK: tl.constexpr):
    """Slow path (a row with NaN/±inf, overflowing squares, or one that could be constant), re-read in
    CHUNK pieces: (absmax, sumsq, nonfinite count, mean, population std, constant |c| or -1) over the
    finite entries, the sums in float64: a finite |h| past 1.8e19 overflows an fp32 square, and a
    near-constant row's fp32 mean is off by up to half an ulp, which at |mean|/std ~ 5e5 moved its std
    by 3e-4 (ingest's is float64). mean and std are returned as float32."""
    amax = tl.zeros((), dtype=tl.float32)
    sq = tl.zeros((), dtype=tl.float64)
    nf = tl.zeros((), dtype=tl.float32)
    sh = tl.zeros((), dtype=tl.float64)
    hmax = tl.full((), -float("inf"), tl.float32)
    hmin = tl.full((), float("inf"), tl.float32)
    for c0 in tl.range(0, n_cols, CHUNK):
        cm = c0 + cols < n_cols
        h = tl.load(X_row + c0 + cols, mask=cm, other=0.0).to(tl.float32)
        a, q, f = finite_partials(h, cm)
        fin = cm & (tl.abs(h) <= FMAX)
        amax = tl.maximum(amax, a)
        sq += q
        nf += f
        sh += tl.sum(tl.where(fin, h, 0.0).to(tl.float64), axis=0)
        hmax = tl.maximum(hmax, tl.max(tl.where(fin, h, -float("inf")), axis=0))
        hmin = tl.minimum(hmin, tl.min(tl.where(fin, h, float("inf")), axis=0))
    cnt = tl.maximum(n_cols - nf, 1.0).to(tl.float64)
    mf = sh / cnt
    ss = tl.zeros((), dtype=tl.float64)
    for c0 in tl.range(0, n_cols, CHUNK):
        cm = c0 + cols < n_cols
        h = tl.load(X_row + c0 + cols, mask=cm, other=0.0).to(tl.float32)
        d = tl.where(cm & (tl.abs(h) <= FMAX), h.to(tl.float64) - mf, 0.0)
        ss += tl.sum(d * d, axis=0)
    return amax, sq, nf, mf.to(tl.float32), tl.sqrt(ss / cnt).to(tl.float32), _const_of(hmax, hmin)
