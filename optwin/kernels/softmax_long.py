"""Softmax over rows longer than a program holds in registers (n > MAX_BLOCK = 65536: a vocabulary's
logits, 128K-256K entries), with the input sketch in the same launch (softmax/triton for those rows).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.softmax import softmax; \
print(softmax(torch.randn(2, 70000))[0].sum(-1))"

Numerics (what optwin.twin's softmax/triton models for n > TRITON_WHOLE_ROW_MAX: twin.softmax's
_online_lane_sum), per row, in TRITON_CHUNK-wide pieces, lane l over elements l, l + CHUNK, ...:
    m_l' = max(m_l, h); s_l = s_l * exp(m_l - m_l') + exp(h - m_l')   online, fp32, no FMA contraction
    m = max over the lanes                    exact
    s = tree over lanes of s_l * exp(m_l - m)
    y = (exp(h - m) / s).to(out dtype)        as the row-in-registers kernel: ex2.approx.ftz
                                              (_common.exp_ftz), e * rcp.approx(s) (_common.div_by_row)
Two passes over the row (max and sum online, then the output, which re-reads the row). H200,
256x128256, µs without / with the sketch, against three passes (max, sum, output) in the same rounds:
bf16 70.6 / 81.1 against 85.5 / 92.0 (torch.compile 95.8), float32 107.8 / 124.3 against 137.1 /
152.9 (torch.compile 150.8); at 8 rows (a decode batch) ~40 / ~56 either way: 8 programs (torch.compile
123) (bench/results/softmax_online_*_h200_s23c.md).
With the sketch the first pass also keeps per lane the sum of squares (fp32), the smallest non-(-inf)
entry and the -inf count, and the output pass carries t = sum e * (h - m) for the entropy; a row whose
squares come out non-finite (NaN/+inf, |h| past 1.8e19, HF's finfo.min masks) is re-read for exact
statistics (softmax_sketch._row_stats_chunked, float64 squares). y is the same with and without the
sketch (the sketch only adds lanes). Persistent programs, one row at a time each.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.kernels._common import (
    FMAX,
    div_by_row,
    exp_ftz,
    launch_config,
    note_occupancy,
    persistent_grid,
    register_cap,
)
from optwin.kernels.sketch_buffer import workspace
from optwin.kernels.softmax_sketch import (
    _merge_extremes,
    _peaked,
    _row_stats_chunked,
    fresh_partials,
    publish_sketch,
)
from optwin.twin.numerics import TRITON_CHUNK

# Registers a thread of the sketched launch: 64 keeps 2 programs of 16 warps per SM. H200, 256x128256,
# µs with the sketch: three passes, uncapped (74 registers, 1 program per SM) -> 64: bf16 106.8 -> 91.6,
# float32 192.8 -> 152.5 (softmax_long_*_h200_s23b.md); two passes (online), 64 -> 80 registers:
# bf16 81.1 -> 104.6, float32 124.3 -> 158.8; 32 warps (58 registers, no cap) 91.5 and 134.7, though
# 65.6 against 70.6 without the sketch (bf16): both launches keep one warp count, for y's tl.sum tree
# (bench/results/softmax_online_*_h200_s23c.md).
SKETCH_MAXNREG = 64


@triton.jit
def _softmax_long_kernel(
    X_ptr, X_row_stride, Y_ptr, Y_row_stride,
    S_ptr,  # sketch features, float64; unused unless SKETCH
    F_ptr,  # workspace float64 slots (absmax, sumsq, max, min, max row range, min row max)
    I_ptr,  # workspace int64 slots (ticket, nonfinite, -inf count, masked rows, peaked rows, eligible rows)
    n_rows, n_cols,
    peak_nats,  # fp32: entropy below which a row is peaked
    SKETCH: tl.constexpr,
    CHUNK: tl.constexpr,  # columns per piece (TRITON_CHUNK: part of the numerics)
):
    pid = tl.program_id(0)
    lanes = tl.arange(0, CHUNK)
    if SKETCH:  # p_rng stays 0: _merge_extremes writes each row's range itself
        p_max, p_min, p_rng, p_rmx, p_sq, p_nf, p_neg, p_masked, p_peak, p_elig = fresh_partials()
    for r in tl.range(pid, n_rows, tl.num_programs(0)):
        X_row = X_ptr + tl.cast(r, tl.int64) * X_row_stride
        Y_row = Y_ptr + tl.cast(r, tl.int64) * Y_row_stride
        mv = tl.full([CHUNK], -float("inf"), tl.float32)  # per lane: running max and sum (online)
        sv = tl.zeros([CHUNK], dtype=tl.float32)
        if SKETCH:  # per lane beside them: squares, smallest non-(-inf) entry, -inf count
            qv = tl.zeros([CHUNK], dtype=tl.float32)
            lv = tl.full([CHUNK], float("inf"), tl.float32)
            nv = tl.zeros([CHUNK], dtype=tl.int32)  # padding included, subtracted below
        for c in tl.range(0, n_cols, CHUNK):
            cc = c + lanes
            h = tl.load(X_row + cc, mask=cc < n_cols, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(mv, h)
            # a lane that has seen only -inf keeps 0 (exp(-inf - -inf) is NaN); a NaN (which the max
            # passes over) or +inf makes its sum NaN, and s with it
            sv = tl.where((mv == -float("inf")) & (h == -float("inf")), 0.0,
                          sv * exp_ftz(mv - m_new) + exp_ftz(h - m_new))
            mv = m_new
            if SKETCH:
                ninf = h == -float("inf")
                hz = tl.where(ninf, 0.0, h)
                qv += hz * hz  # NaN/+inf or squares past float32: non-finite, the exact pass below
                lv = tl.minimum(lv, tl.where(ninf, float("inf"), h))
                nv += ninf.to(tl.int32)
        m = tl.max(mv, 0)
        s = tl.sum(tl.where((mv == -float("inf")) & (sv == 0.0), 0.0, sv * exp_ftz(mv - m)), 0)
        tv = tl.zeros([CHUNK], dtype=tl.float32)  # the sketch's t (dead code without it)
        for c in tl.range(0, n_cols, CHUNK):
            cc = c + lanes
            cm = cc < n_cols
            d = tl.load(X_row + cc, mask=cm, other=-float("inf")).to(tl.float32) - m
            e = exp_ftz(d)  # padding and masked lanes: exp(-inf) = 0
            tl.store(Y_row + cc, div_by_row(e, s).to(Y_ptr.dtype.element_ty), mask=cm)
            if SKETCH:
                tv += tl.where(e > 0.0, e * d, 0.0)
        if SKETCH:
            sq = tl.sum(qv, 0).to(tl.float64)
            if sq <= FMAX:  # no NaN/+inf: m is the finite max (-inf where the row is all -inf)
                nf = tl.zeros((), dtype=tl.int64)
                nneg = tl.sum(nv, 0).to(tl.int64) - (tl.cdiv(n_cols, CHUNK) * CHUNK - n_cols)
                rmax, rmin = m, tl.min(lv, 0)
            else:  # rare: exact statistics, float64 squares (one more pass over the row)
                sq, nf, nneg, rmax, rmin = _row_stats_chunked(X_row, n_cols, CHUNK)
            elig = (nf == 0) & (rmax >= rmin)  # a finite entry and no NaN/+inf: then m = rmax
            p_max, p_min, p_rng, p_rmx = _merge_extremes(p_max, p_min, p_rng, p_rmx, rmax, rmin, F_ptr)
            p_sq += sq
            p_nf += nf
            p_neg += nneg
            p_masked += (nneg == n_cols).to(tl.int32)
            p_elig += elig.to(tl.int32)
            p_peak += tl.where(elig, _peaked(s, tl.sum(tv, 0), peak_nats), 0)
    if SKETCH:
        publish_sketch(S_ptr, F_ptr, I_ptr, p_max, p_min, p_rng, p_rmx, p_sq, p_nf, p_neg, p_masked, p_peak, p_elig,
                       n_rows, n_cols, 1.0)


def softmax_long_launch(x2: torch.Tensor, y2: torch.Tensor, buf: torch.Tensor | None, peak_nats: float,
                        num_warps: int | None = None, per_sm: int | None = None, maxnreg: int | None = None) -> None:
    """Rows of x2 longer than MAX_BLOCK into y2 (and the sketch into buf): persistent programs over
    the rows, TRITON_CHUNK columns a piece. num_warps / per_sm / maxnreg: the bench's overrides."""
    n_rows, n = x2.shape
    sketch = buf is not None
    if n_rows == 0 and not sketch:
        return
    block, warps, _, _ = launch_config("softmax-chunked", n, num_warps, 1, chunk=TRITON_CHUNK)
    f, i = workspace("softmax", x2.device) if sketch else (y2, y2)
    cap = maxnreg if maxnreg is not None else SKETCH_MAXNREG if sketch else None
    key = ("softmax-chunked", x2.dtype, y2.dtype, block, warps, sketch, cap)
    k = _softmax_long_kernel[(persistent_grid(key, n_rows, x2.device, per_sm),)](
        x2, x2.stride(0), y2, y2.stride(0), buf if sketch else y2, f, i, n_rows, n, peak_nats,
        SKETCH=sketch, CHUNK=block, num_warps=warps, enable_fp_fusion=False, **register_cap(cap),
    )
    note_occupancy(key, k, warps)
