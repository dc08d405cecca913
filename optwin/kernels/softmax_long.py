"""Softmax over rows longer than a program holds in registers (n > MAX_BLOCK = 65536: a vocabulary's
logits, 128K-256K entries, or the scores of one decode step over a long context), with the input
sketch in the same launches (softmax/triton for those rows).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.softmax import softmax; \
print(softmax(torch.randn(2, 70000))[0].sum(-1))"

Numerics (what optwin.twin's softmax/triton models for n > TRITON_WHOLE_ROW_MAX: twin.softmax's
_piece_sums), per row, in pieces k of TRITON_CHUNK columns:
    m_k = max over the piece                       exact (0 stands in for m_k = -inf below)
    s_k = tree sum of exp(h - m_k)                 ex2.approx.ftz (_common.exp_ftz), fp32 tree
    m   = max_k m_k                                exact
    s   = fp32(sum_k s_k * exp(m_k - m))           products and sum in float64 (exact products;
                                                   the order of the sum leaves the fp32 value
                                                   alone but at ties): one rounding
    y   = (exp(h - m) / s).to(out dtype)           as the row-in-registers kernel (_common.div_by_row)
Two launches, a program per (row, piece): the first writes each piece's (m_k, s_k), the second reads
its row's pieces, takes m and s and writes its piece of y. The numerics are those of the row alone:
the same y at any batch size. The second launch walks the pieces last first: the first launch read
those last, and they are still in the L2 where x outgrows it. H200, µs without / with the sketch against
stop 23's program per row (per-lane online sums, then the output pass; 5 interleaved rounds,
bench/results/long_*_h200_s24c.md and _s24d.md):
    bf16 8x128256 (a decode batch; CUDA graphs)   4.6 / 7.5   against 25.9 / 34.5  (torch.compile 8.9)
    bf16 64x128256 (CUDA graphs)                  11.9 / 19.6 against 26.5 / 35.2  (22.4)
    bf16 256x128256 (L2 flushed)                  55.4 / 78.6 against 70.1 / 80.6  (96.5)
    bf16 256x128256 (CUDA graphs)                 49.8 / 73.9 against 66.4 / 76.7  (87.2)
    float32 256x128256 (L2 flushed)               103.6 / 112.6 against 108.1 / 124.3 (150.9)
The second launch in piece order instead: 58.1 / 81.1, 54.0 / 77.7 and 106.9 / 115.4 at 256 rows.
Sketch: the first launch also writes per piece its finite max and min, float64 sum of squares, NaN/+inf
and -inf counts, and t_k = sum e*(h - m_k) over its e > 0; the second launch's program for a row's
first piece turns the row's records into the row's features (t = sum_k exp(m_k - m) * (t_k + s_k *
(m_k - m)), the entropy log(s) - t/s, masked, eligible) and publishes them, so no row is re-read. y
is the same with and without the sketch (the sketch only adds lanes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.errors import InputError
from optwin.kernels._common import (
    FMAX,
    INTERPRET,
    aligned,
    aligned_rows,
    cdiv,
    column_multiple,
    div_by_row,
    exp_ftz,
    launch_config,
    next_pow2,
    note_occupancy,
    register_cap,
    store_cast,
)
from optwin.kernels.fast_launch import launch
from optwin.kernels.sketch_buffer import workspace
from optwin.kernels.softmax_sketch import (
    _max_min,
    _merge_extremes,
    _peaked,
    fresh_partials,
    publish_sketch,
)
from optwin.twin.numerics import TRITON_CHUNK

# Pieces a row may have: the second launch holds a row's (m_k, s_k) in one vector (rows up to 16.7M).
MAX_PIECES = 4096
# Per-piece sketch records (float64, one plane each): t_k, finite max, finite min, sum of squares,
# NaN/+inf count, -inf count.
RECORDS = 6


@triton.jit
def _sum4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _piece_kernel(
    X_ptr, X_row_stride,
    MS_ptr,  # float32 (2, n_rows, n_pieces): each piece's max m_k and sum s_k
    R_ptr,  # float64 (RECORDS, n_rows, n_pieces): the sketch's records; unused unless SKETCH
    n_rows, n_cols, n_pieces,
    SKETCH: tl.constexpr,
    CHUNK: tl.constexpr,  # columns per piece (TRITON_CHUNK: part of the numerics)
    ALIGN: tl.constexpr = 1,  # n_cols and the row strides are multiples of it (_common.column_multiple)
):
    pid = tl.program_id(0)
    n_cols = aligned(n_cols, ALIGN)
    X_row_stride = aligned(X_row_stride, ALIGN)
    r = pid // n_pieces
    k = pid % n_pieces
    cols = k * CHUNK + tl.arange(0, CHUNK)
    cm = cols < n_cols
    h = tl.load(X_ptr + tl.cast(r, tl.int64) * X_row_stride + cols, mask=cm, other=-float("inf")).to(tl.float32)
    if SKETCH:  # the sketch rides in the op's two trees: (max, finite min), then (s, t, squares, -inf count)
        fin = tl.abs(h) <= FMAX  # padding is -inf: never finite
        if INTERPRET:  # no tuple reduce there
            m_k, fmin = tl.max(h, 0), tl.min(tl.where(fin, h, float("inf")), 0)
        else:
            m_k, fmin = tl.reduce((h, tl.where(fin, h, float("inf"))), 0, _max_min)
    else:
        m_k = tl.max(h, 0)  # passes over NaN (whose e is NaN, and s_k with it)
    d = h - tl.where(m_k == -float("inf"), 0.0, m_k)  # a piece of only -inf: e = 0, s_k = 0
    e = exp_ftz(d)
    if SKETCH:
        hz = tl.where(fin, h, 0.0)
        td = e * tl.maximum(d, -FMAX)  # -inf entries (and padding) add 0 * -FMAX, not NaN
        neg = (h == -float("inf")).to(tl.float32)  # padding included: taken off below
        if INTERPRET:
            s_k, t_k, sq, nneg = tl.sum(e, 0), tl.sum(td, 0), tl.sum(hz * hz, 0), tl.sum(neg, 0)
        else:  # s_k: tl.sum's lanes and tree (y is the same with and without the sketch)
            s_k, t_k, sq, nneg = tl.reduce((e, td, hz * hz, neg), 0, _sum4)
    else:
        s_k = tl.sum(e, 0)
    slot = tl.cast(r, tl.int64) * n_pieces + k
    plane = tl.cast(n_rows, tl.int64) * n_pieces
    tl.store(MS_ptr + slot, m_k)
    tl.store(MS_ptr + plane + slot, s_k)
    if SKETCH:
        sq64 = sq.to(tl.float64)
        fmax = m_k  # the finite max, but where the piece holds +inf (NaN passes the max by)
        nf = tl.zeros((), dtype=tl.float64)
        if s_k != s_k:  # rare: NaN or +inf in the piece (its s_k is NaN then, and only then)
            fmax = tl.max(tl.where(fin, h, -float("inf")), 0)
            nf = tl.sum(tl.where(fin | (h < -FMAX) | ~cm, 0.0, 1.0), 0).to(tl.float64)
        if sq > FMAX:  # rare: squares past float32 (|h| > 1.8e19; HF's finfo.min masks): float64
            a = hz.to(tl.float64)
            sq64 = tl.sum(a * a, 0)
        tl.store(R_ptr + slot, t_k.to(tl.float64))
        tl.store(R_ptr + plane + slot, fmax.to(tl.float64))
        tl.store(R_ptr + 2 * plane + slot, fmin.to(tl.float64))
        tl.store(R_ptr + 3 * plane + slot, sq64)
        tl.store(R_ptr + 4 * plane + slot, nf)
        pad = tl.maximum(k * CHUNK + CHUNK - n_cols, 0)  # the last piece's padding
        tl.store(R_ptr + 5 * plane + slot, nneg.to(tl.float64) - pad)


@triton.jit
def _row_features(R_ptr, slot0, plane, kk, km, mk, sk, m, s, n_cols, peak_nats, p_max, p_min, p_rng, p_rmx, F_ptr):
    """One row's sketch from its pieces' records, merged into fresh partials: (p_max, p_min, p_rng,
    p_rmx, sq, nonfinite, -inf count, masked, eligible, peaked)."""
    t_k = tl.load(R_ptr + slot0 + kk, mask=km, other=0.0)
    rmax = tl.max(tl.load(R_ptr + plane + slot0 + kk, mask=km, other=-float("inf")), 0).to(tl.float32)
    rmin = tl.min(tl.load(R_ptr + 2 * plane + slot0 + kk, mask=km, other=float("inf")), 0).to(tl.float32)
    sq = tl.sum(tl.load(R_ptr + 3 * plane + slot0 + kk, mask=km, other=0.0), 0)
    nf = tl.sum(tl.load(R_ptr + 4 * plane + slot0 + kk, mask=km, other=0.0), 0).to(tl.int64)
    nneg = tl.sum(tl.load(R_ptr + 5 * plane + slot0 + kk, mask=km, other=0.0), 0).to(tl.int64)
    elig = (nf == 0) & (rmax >= rmin)  # a finite entry and no NaN/+inf: then m = rmax
    # t about the row max: each piece's e is exp(m_k - m) times its own, its d is (h - m_k) + (m_k - m)
    m64 = m.to(tl.float64)
    mk64 = mk.to(tl.float64)
    a = exp_ftz(mk - m).to(tl.float64)
    t = tl.sum(tl.where(mk != -float("inf"), a * (t_k + sk.to(tl.float64) * (mk64 - m64)), 0.0), 0)
    p_max, p_min, p_rng, p_rmx = _merge_extremes(p_max, p_min, p_rng, p_rmx, rmax, rmin, F_ptr)
    peak = tl.where(elig, _peaked(s, t.to(tl.float32), peak_nats), 0)
    return p_max, p_min, p_rng, p_rmx, sq, nf, nneg, (nneg == n_cols).to(tl.int32), elig.to(tl.int32), peak


@triton.jit
def _piece_out_kernel(
    X_ptr, X_row_stride, Y_ptr, Y_row_stride,
    MS_ptr,  # float32 (2, n_rows, n_pieces) from _piece_kernel
    R_ptr,  # float64 (RECORDS, n_rows, n_pieces) from _piece_kernel; unused unless SKETCH
    S_ptr,  # sketch features, float64; unused unless SKETCH
    F_ptr,  # workspace float64 slots (sumsq, max, min, max row range, min row max)
    I_ptr,  # workspace int64 slots (ticket, nonfinite, -inf count, masked | peaked rows << 32, eligible rows)
    n_rows, n_cols, n_pieces,
    n_pub,  # programs that publish a sketch: one per row (one in all for no rows)
    peak_nats,  # fp32: entropy below which a row is peaked
    SKETCH: tl.constexpr,
    CHUNK: tl.constexpr,
    PIECES: tl.constexpr,  # next_pow2(n_pieces)
    ALIGN: tl.constexpr = 1,  # n_cols and the row strides are multiples of it (_common.column_multiple)
):
    # last piece first: the first launch read it last, so it may still be in the L2 (x outgrows the L2
    # at a few hundred vocabulary rows)
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    n_cols, X_row_stride, Y_row_stride = aligned_rows(n_cols, X_row_stride, Y_row_stride, ALIGN)
    r = pid // n_pieces
    k = pid % n_pieces
    if SKETCH:  # p_rng stays 0: _merge_extremes writes the row's range itself
        p_max, p_min, p_rng, p_rmx, p_sq, p_nf, p_neg, p_masked, p_peak, p_elig = fresh_partials()
    if r < n_rows:  # (a sketched launch over no rows is one program that publishes nothing but itself)
        kk = tl.arange(0, PIECES)
        km = kk < n_pieces
        slot0 = tl.cast(r, tl.int64) * n_pieces
        plane = tl.cast(n_rows, tl.int64) * n_pieces
        mk = tl.load(MS_ptr + slot0 + kk, mask=km, other=-float("inf"))
        sk = tl.load(MS_ptr + plane + slot0 + kk, mask=km, other=0.0)
        m = tl.max(mk, 0)
        # pieces of only -inf add 0 (exp(-inf - -inf) would be NaN); a NaN m_k or s_k makes s NaN
        w = tl.where(mk != -float("inf"), sk.to(tl.float64) * exp_ftz(mk - m).to(tl.float64), 0.0)
        s = tl.sum(w, 0).to(tl.float32)
        cols = k * CHUNK + tl.arange(0, CHUNK)
        cm = cols < n_cols
        h = tl.load(X_ptr + tl.cast(r, tl.int64) * X_row_stride + cols, mask=cm, other=-float("inf")).to(tl.float32)
        y = div_by_row(exp_ftz(h - m), s)
        tl.store(Y_ptr + tl.cast(r, tl.int64) * Y_row_stride + cols, store_cast(y, Y_ptr.dtype.element_ty), mask=cm)
        if SKETCH:
            if k == 0:
                p_max, p_min, p_rng, p_rmx, p_sq, p_nf, p_neg, p_masked, p_elig, p_peak = _row_features(
                    R_ptr, slot0, plane, kk, km, mk, sk, m, s, n_cols, peak_nats, p_max, p_min, p_rng, p_rmx, F_ptr)
    if SKETCH:
        if k == 0:  # a row's first piece publishes the row (or the one program of an empty launch)
            publish_sketch(S_ptr, F_ptr, I_ptr, p_max, p_min, p_rng, p_rmx, p_sq, p_nf, p_neg, p_masked, p_peak,
                           p_elig, n_rows, n_cols, n_pub, 1.0)


# Registers a thread of the sketched launches (both kernels): uncapped, the first launch's sketch at 4 warps
# held 152 (offline sm_90a), 3 programs per SM. H200, bf16 256x128256, µs with the sketch: 78.5 uncapped,
# 74.7 at 96, 77.0 at 128; without the sketch 55.3 either way (bench/results/long_maxnreg_h200_s25.md)
SKETCH_REG_CAP = 96


def softmax_long_launch(x2: torch.Tensor, y2: torch.Tensor, buf: torch.Tensor | None, peak_nats: float,
                        num_warps: int | None = None, maxnreg: int | None = None, piece: int | None = None) -> None:
    """Rows of x2 longer than MAX_BLOCK into y2 (and the sketch into buf): two launches of a program
    per (row, TRITON_CHUNK-column piece). num_warps / maxnreg / piece: the bench's overrides (a piece
    other than TRITON_CHUNK is not the twin's numerics)."""
    n_rows, n = x2.shape
    sketch = buf is not None
    if n_rows == 0 and not sketch:
        return
    chunk, warps, _, _ = launch_config("softmax-pieces", n, num_warps, 1, chunk=piece or TRITON_CHUNK)
    pieces = cdiv(n, chunk)
    if pieces > MAX_PIECES:
        raise InputError(f"softmax: rows of {n} exceed the {MAX_PIECES * chunk} columns a row may have")
    held = max(n_rows, 1)  # no null pointers for an empty batch
    ms = torch.empty((2, held, pieces), dtype=torch.float32, device=x2.device)
    rec = torch.empty((RECORDS, held, pieces), dtype=torch.float64, device=x2.device) if sketch else ms
    f, i = workspace("softmax", x2.device) if sketch else (y2, y2)
    if maxnreg is None and sketch:
        maxnreg = SKETCH_REG_CAP
    extra = {"num_warps": warps, "enable_fp_fusion": False, **register_cap(maxnreg)}
    align = column_multiple(n, x2.stride(0), y2.stride(0))
    if n_rows:
        # FMA contraction only touches the sketch's products (t, squares): y's path has none
        k = launch(_piece_kernel, (n_rows * pieces,), x2, x2.stride(0), ms, rec, n_rows, n, pieces, SKETCH=sketch, CHUNK=chunk,
                   ALIGN=align,
                                              **{**extra, "enable_fp_fusion": sketch})
        note_occupancy(("softmax-pieces", x2.dtype, chunk, warps, sketch, maxnreg, align), k, warps)
    k = launch(_piece_out_kernel, (max(n_rows * pieces, 1),),
        x2, x2.stride(0), y2, y2.stride(0), ms, rec, buf if sketch else y2, f, i, n_rows, n, pieces, held, peak_nats,
        SKETCH=sketch, CHUNK=chunk, PIECES=next_pow2(pieces), ALIGN=align, **extra,
    )
    note_occupancy(("softmax-pieces-out", x2.dtype, y2.dtype, chunk, warps, sketch, maxnreg, align), k, warps)
