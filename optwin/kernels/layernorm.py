"""LayerNorm over the last dim in Triton, with the input sketch in the same pass (layernorm/triton).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.layernorm import layernorm; \
print(layernorm(torch.randn(2, 5), torch.ones(5), torch.zeros(5))[0])"

Numerics (what optwin.twin's layernorm/triton models), per row of n = hidden elements:
    h = x.float()                              # exact
    m = tl.sum(h) / n                          # fp32 reduction tree, IEEE fp32 divide (div_rn)
    d = h - m                                  # fp32
    var = sum_squares(d) / n                   # two-pass (no E[x^2]-m^2 cancellation): each 4 neighbours' squares
                                               # folded with FMAs, an fp32 tree over the partials, IEEE fp32 divide
    r = rsqrt(var + eps)                       # eps as fp32 scalar; approximate rsqrt (rsqrt.approx.f32)
    y = fma(d * r, w.float(), b.float()).to(dtype)  # fp32: d*r rounded, then one FMA, one rounding to dtype
Rows longer than MAX_BLOCK (65536) go to a three-pass kernel over TRITON_CHUNK-wide pieces: each sum
is then one fp32 accumulator per lane over the pieces, then the tree (the twin's order "blocked"), and
every product rounds (no FMA).
Rows of 4096..65536 that a chunk c of 4096, 2048 or 1024 divides into at least 3 pieces
(twin.numerics.welford_chunk: the largest such c) take the Welford kernel instead, a program per row as
torch.compile runs layernorm (_layernorm_welford_kernel):
    lane l (of c) runs Welford over h[l], h[l + c], ...:
        first piece mean = h, M2 = 0; then per piece k: r = div_rn(1, k) (one scalar per piece);
        delta = h - mean; mean = fma(delta, r, mean); M2 = fma(delta, h - mean, M2)
    a tree of Chan merges over the lanes (frac = div_rn(wb, wa + wb); mean = ma + delta*frac;
    M2 = (qa + qb) + ((delta*delta)*wa)*frac, each op rounded), var = div_rn(M2, n)
    y = fma((h - m) * rsqrt(var + eps), w, b), a second pass over the row (an L2 hit)
(twin.layernorm.welford(..., lanes=c, fma_update=True); the GPU's tree order is tl.reduce's, the
interpreter runs the twin's halving tree). H200 bf16, µs L2 flushed, against torch.compile: 4096x16384
71.1 (73.1), 8192x8192 70.3 (77.4), 16384x4096 69.7 (96.4), 8192x5120 47.6 (78.0), 2048x32768 77.9
(107.7); the row-in-registers kernel 76.5, 92.7, 77.8, 78.5, 94.9 (bench/results/layernorm_welford_h200_s20*.md).
With the sketch at 4096x16384: 77.0 / 73.6 flushed / graph, against the row-in-registers launch's 79.8 / 75.6.
Compiled without FMA contraction (enable_fp_fusion=False), the FMAs written out: with contraction on,
LLVM fused a different set of the d*d products into FMAs once the sketch added uses of h (H200,
2026-11: y changed at 1823x781 and at 7x1025 float32), so the sketch changed y. Written out they are
the same with and without the sketch, and the twin models each rounding.
The sketch (y is bit-identical with and without it: the op's sums are the same code in both):
- max |h| is a per-lane running max across the row loop (no tree per row);
- each row's (mean, var, constant-row |c|) waits in a slot, one per lane, and the slots' partials
  are computed LANES rows at a time: sumsq = n*(var + m*m) (positive terms, no cancellation, agrees
  with the tree sum of h*h to float32 rounding), row mean/std = m, sqrt(var);
- exactly constant rows (all entries equal) leave max_mean_over_std to `const_absmax` (their |c|).
  A constant row has all d equal, so var = d*d and |m|/std >= ~2^20 (m is c to a few ulps), or
  var = 0. Rows with var == 0 or m*m >= var * 2^32 (|m|/std >= 2^16) leave their ratio to the pass
  after the loop, which compares the row's max with its min (exact, as ingest does);
- that pass re-reads the program's rows when it had such a row or one with NaN/±inf (or overflowing
  squares: exact finite-only partials), and recomputes the program's max |x| (the lanes saw those
  rows). A test inside the row loop instead (a branch that re-read the row) cost +7 % on every call
  (H200, stop 12: 92.2 against 87.1 µs with the sketch, bench/results/norm_chunks_h200_s12c.md).
Memory: read rows*n (x, evict-first) + 2n per row (weight, bias: L1/L2 hits), write rows*n (y);
persistent programs (without the sketch a program per row: _common.ROW_GRID); with the sketch a
few scalar atomics per program and the feature vector.
Launch at BLOCK 16384 (_common.TUNED, SKETCH_STAGES, REG_CAP): 8 warps capped at 128 registers (2
programs per SM; uncapped 1); 1 loop stage without the sketch, 2 with it. H200, 4096x16384 bf16, µs
without / with the sketch: 79.8 / 80.1 (bench/results/norm_chunks_h200_s14f.md), against 79.2 / 82.5
for stop 13's code (products rounded, both launches at 2 stages) in the same rounds and 80.1 / 90.1 at
the 4 warps of stop 12 (bench/results/norm_chunks_h200_s13*.md). The weight/bias partials are taken by the
last program, which has the fewest rows: in program 0 (one of the most) the sketched launch at 2 stages
read 96.2 µs, at 1 stage 85.4.
Layouts measured and dropped (stop 11, bench/results/sketch_lanes_h200_s11b.md, 4096x16384 bf16, 4 warps
2 stages, µs without / with the sketch): a max tree per row 80.4/90.1, lane max without slots 80.3/90.0,
exact partials inline in the loop (h live across it) 80.6/90.2 (the shipped layout 80.9/88.8).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.catalog import CATALOG
from optwin.errors import InputError
from optwin.kernels import _common
from optwin.kernels._common import (
    FMAX,
    INTERPRET,
    INTERPRETED,
    MAX_BLOCK,
    RECORD_FLAG_HI,
    RECORD_POLL,
    acquire_flag,
    check_device,
    finish_norm_sketch,
    finite_partials,
    finite_partials_chunked,
    grid_per_sm,
    lane_max,
    lane_shape,
    last_program,
    launch_config,
    max_sum_max,
    note_occupancy,
    persistent_grid,
    poll_records,
    read_slot,
    record_halves,
    record_word,
    register_cap,
    release_flag,
    rows_view,
    store_common_features,
    sum_squares,
)
from optwin.kernels.sketch_buffer import (
    RATIO_CAP,
    WORKSPACE,
    feature_names,
    new_buffer,
    row_records,
    workspace,
)
from optwin.twin.numerics import TRITON_CHUNK
from optwin.twin.numerics import welford_chunk as _welford_rule

# Columns per piece of the exact pass after the row loop: small, so the rare pass adds few registers
# to the kernel (the loop's row is not held for it).
EXACT_CHUNK = 256
EPS = CATALOG["layernorm"].constants["eps"]
# The Welford launch: twin.numerics.welford_chunk's chunk (numerics), 8 elements (one 16-byte bf16
# vector) a thread a piece: num_warps = chunk / 256. H200 bf16, µs L2 flushed, chunk/warps (torch.compile;
# the row in registers): 4096x16384 4096/16 70.8, /8 78.7 (72.8; 76.5); 8192x8192 2048/8 70.3, 4096/8
# 69.9, 4096/16 89.6 (77.4; 92.7); 16384x4096 1024/4 69.7, 2048/8 80.7 (96.4; 77.8); 8192x6144 2048/8
# 54.2 (65.6); 8192x5120 1024/4 47.6 (78.0); 2048x32768 4096/16 77.9 (107.7; 94.9)
# (bench/results/layernorm_welford_h200_s20*.md). The chunk must divide the row: a ragged last piece
# (12000 at 4096) ran no faster than the row in registers, and +13 % against +7 % with the sketch.
ELEMS_PER_THREAD = 8
# Registers a thread of the sketched Welford launch (None: the compiler's, 40 at 4096/16 with triton 3.9
# offline: 3 programs per SM against 4 without the sketch). Capped at 32 it spilled: 82.5 against 76.6
# µs with the sketch (norm_chunks_h200_s20b.md).
WELFORD_REG_CAP: int | None = None
KEEP = 1  # max |x| chains per lane: [LANES, KEEP] registers (KEEP 8 measured the same, 89.3 µs)
# A row whose |mean|/std reaches 2^16 (or whose var is 0) is tested for being constant: m*m >= var * SUSPECT.
SUSPECT: tl.constexpr = tl.constexpr(2.0**32)
assert feature_names("layernorm") == (
    "numel", "rows", "absmax", "rms", "nonfinite", "hidden", "max_mean_over_std", "min_row_std", "weight_absmax",
    "bias_absmax", "const_absmax")
assert [n for n, _ in WORKSPACE["layernorm"][0]] == ["absmax", "sumsq", "max_ratio", "min_std", "const_absmax"]
assert WORKSPACE["layernorm"][1] == ("ticket", "nonfinite", "param_nonfinite")


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
def _publish(S_ptr, F_ptr, I_ptr, p_amax, p_sq, p_ratio, p_minstd, p_nf, p_const, n_rows, n_cols, CAP: tl.constexpr):
    """Merge one program's sketch partials into the workspace; the last program writes the features."""
    tl.atomic_max(F_ptr + 0, p_amax.to(tl.float64), sem="relaxed")
    tl.atomic_add(F_ptr + 1, p_sq, sem="relaxed")
    tl.atomic_max(F_ptr + 2, p_ratio.to(tl.float64), sem="relaxed")
    tl.atomic_min(F_ptr + 3, p_minstd.to(tl.float64), sem="relaxed")
    tl.atomic_max(F_ptr + 4, tl.maximum(p_const, 0.0).to(tl.float64), sem="relaxed")
    tl.atomic_add(I_ptr + 1, p_nf, sem="relaxed")
    if last_program(I_ptr):
        g_ratio = read_slot(F_ptr + 2)
        g_minstd = read_slot(F_ptr + 3)
        g_const = read_slot(F_ptr + 4)
        finish_norm_sketch(S_ptr, F_ptr, I_ptr, n_rows, n_cols)
        _store_own_features(S_ptr, g_ratio, g_minstd, g_const, n_rows, CAP)


@triton.jit
def _layernorm_kernel(
    X_ptr,  # x as (n_rows, n_cols) in dtype, last dim contiguous
    X_row_stride,
    W_ptr,  # weight (n_cols,) in dtype
    B_ptr,  # bias (n_cols,) in dtype
    Y_ptr,  # y as (n_rows, n_cols) in dtype, contiguous
    Y_row_stride,
    S_ptr,  # sketch features, float64 (11,); unused unless SKETCH
    F_ptr,  # workspace float64 slots (absmax, sumsq, max |mean|/std, min std, largest constant |c|)
    I_ptr,  # workspace int64 slots (ticket, nonfinite x, nonfinite weight + bias)
    n_rows,
    n_cols,
    eps,  # fp32 scalar
    CAP: tl.constexpr,
    BLOCK: tl.constexpr,
    SKETCH: tl.constexpr,
    STAGES: tl.constexpr,  # loads in flight in the row loop (1: none ahead; >1: async copies)
    VEC: tl.constexpr,  # elements per 16-byte vector of x
    LANES: tl.constexpr,  # lanes of the accumulator (_common.lane_shape)
    KEEP: tl.constexpr,  # independent accumulator chains per lane (divides VEC; _common's lane partials)
    EXACT_CHUNK: tl.constexpr,  # columns per piece of the exact pass after the loop (few registers)
):
    # Persistent: programs walk rows pid, pid + grid, ...; each row is still reduced by one program
    # in one tree (numerics independent of the grid).
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if SKETCH:
        p_ratio = tl.zeros((), dtype=tl.float32)
        p_minstd = tl.full((), float("inf"), tl.float32)
        p_sq = tl.zeros((), dtype=tl.float64)
        p_nf = tl.zeros((), dtype=tl.int64)
        p_const = tl.full((), -1.0, tl.float32)  # largest |c| of a constant row, -1 when none
        p_later = tl.zeros((), dtype=tl.int32)  # rows left to the pass after the loop (bad, or maybe constant)
        a_amax = tl.zeros([LANES, KEEP], dtype=tl.float32)  # per lane: max |h| over the program's rows
        lane_id = tl.arange(0, LANES)
        sl_m = tl.zeros([LANES], dtype=tl.float32)
        sl_var = tl.zeros([LANES], dtype=tl.float32)
        k = tl.zeros((), dtype=tl.int32)  # rows held in the slots
    for r in tl.range(pid, n_rows, tl.num_programs(0), num_stages=STAGES):
        row = tl.cast(r, tl.int64)  # 64-bit offsets for tensors past 2^31 elements
        x = tl.load(X_ptr + row * X_row_stride + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        h = x.to(tl.float32)
        if SKETCH:  # NaN/±inf rows are caught by the slots' row test and redone after the loop
            a_amax = tl.maximum(a_amax, lane_max(tl.abs(h), BLOCK, LANES, VEC, KEEP))
        # IEEE division (div.rn), as the twin models it: Triton's `/` is div.full.f32 (~2 ulp), and a
        # constant row's mean one ulp off made h - m nonzero: y = bias became (h-m)*rsqrt(eps) on the H200
        m = tl.math.div_rn(tl.sum(h, axis=0), tl.cast(n_cols, tl.float32))  # first pass (registers)
        d = tl.where(mask, h - m, 0.0)
        var = tl.math.div_rn(sum_squares(d, BLOCK), tl.cast(n_cols, tl.float32))  # second pass over registers, not memory
        rs = tl.math.rsqrt(var + eps)  # approximate rsqrt
        w = tl.load(W_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        b = tl.load(B_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        y = tl.fma(d * rs, w, b)  # one rounding for the last product and the add
        tl.store(Y_ptr + row * Y_row_stride + cols, y.to(Y_ptr.dtype.element_ty), mask=mask,
                 eviction_policy="evict_first")  # write n
        if SKETCH:  # the per-row scalar work (sqrt, divide, float64 add) off each row's path
            sel = lane_id == k
            sl_m = tl.where(sel, m, sl_m)
            sl_var = tl.where(sel, var, sl_var)
            k += 1
            if k == LANES:
                r_ratio, r_std, r_sq, r_later = _slot_partials(sl_m, sl_var, lane_id < LANES, n_cols, CAP)
                p_ratio = tl.maximum(p_ratio, r_ratio)
                p_minstd = tl.minimum(p_minstd, r_std)
                p_sq += r_sq
                p_later += r_later
                k = 0
    if SKETCH:
        r_ratio, r_std, r_sq, r_later = _slot_partials(sl_m, sl_var, lane_id < k, n_cols, CAP)
        p_ratio = tl.maximum(p_ratio, r_ratio)
        p_minstd = tl.minimum(p_minstd, r_std)
        p_sq += r_sq
        p_later += r_later
        p_amax = tl.max(a_amax).to(tl.float32)
        if p_later > 0:  # rare: re-read this program's rows; no load or branch of it sits in the row loop
            p_amax = tl.zeros((), dtype=tl.float32)  # the lanes may have seen NaN/±inf rows: from scratch
            for r2 in tl.range(pid, n_rows, tl.num_programs(0)):
                h2 = tl.load(X_ptr + tl.cast(r2, tl.int64) * X_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
                m2 = tl.math.div_rn(tl.sum(h2, axis=0), tl.cast(n_cols, tl.float32))  # the loop's own values and tests
                d2 = tl.where(mask, h2 - m2, 0.0)
                var2 = tl.math.div_rn(sum_squares(d2, BLOCK), tl.cast(n_cols, tl.float32))
                if not ((var2 + m2 * m2) * n_cols <= FMAX):  # NaN/±inf or overflow: exact partials,
                    # re-read in EXACT_CHUNK pieces (float64 squares over a held row spilled 200 bytes)
                    amax2, sq2, nf2, mf2, sf2, c2 = _chunked_exact_row(
                        X_ptr + tl.cast(r2, tl.int64) * X_row_stride, tl.arange(0, EXACT_CHUNK), n_cols, EXACT_CHUNK)
                    p_amax, p_ratio, p_minstd, p_sq, p_nf, p_const = _merge_row(
                        p_amax, p_ratio, p_minstd, p_sq, p_nf, p_const, amax2, sq2, nf2, mf2, sf2, c2, CAP)
                else:  # trees over h2 only (d2 is dead here: h2 and d2 live together spilled 2 KiB)
                    hmax = tl.max(tl.where(mask, h2, -float("inf")), axis=0)
                    hmin = tl.min(tl.where(mask, h2, float("inf")), axis=0)
                    p_amax = tl.maximum(p_amax, tl.maximum(tl.abs(hmax), tl.abs(hmin)))
                    if _could_be_constant(m2, var2):  # its ratio was left out of the slots
                        c2 = _const_of(hmax, hmin)
                        p_ratio = tl.maximum(p_ratio, _ratio(m2, tl.sqrt(var2), c2, CAP))
                        p_const = tl.maximum(p_const, c2)
        if pid == tl.num_programs(0) - 1:  # the parameters' partials: the last program has the fewest rows
            _param_partials(W_ptr, B_ptr, S_ptr, I_ptr, cols, n_cols, BLOCK)
        _publish(S_ptr, F_ptr, I_ptr, p_amax, p_sq, p_ratio, p_minstd, p_nf, p_const, n_rows, n_cols, CAP)


# ------------------------------------------------------------------ Welford over pieces, a program per row


@triton.jit
def _welford_merge(ma, qa, wa, mb, qb, wb):
    """Chan's merge of two lanes' (mean, M2, count), each op rounded as twin.layernorm.welford's tree
    models it (the kernel compiles without FMA contraction); the count ratio divides IEEE (div_rn)."""
    delta = mb - ma
    w = wa + wb
    frac = tl.where(w == 0.0, 0.0, tl.math.div_rn(wb, tl.where(w == 0.0, 1.0, w)))
    return ma + delta * frac, qa + qb + delta * delta * wa * frac, w


@triton.jit
def _welford_tree(mean, m2, cnt, CHUNK: tl.constexpr):
    """The interpreter's form of the merge tree: lane i merged with lane i + half, halving to one (the
    order twin.layernorm.welford models; the interpreter's tl.reduce folds left, lane by lane)."""
    H: tl.constexpr = CHUNK // 2
    ma, mb = tl.split(tl.permute(tl.reshape(mean, [2, H]), [1, 0]))
    qa, qb = tl.split(tl.permute(tl.reshape(m2, [2, H]), [1, 0]))
    wa, wb = tl.split(tl.permute(tl.reshape(cnt, [2, H]), [1, 0]))
    m, q, w = _welford_merge(ma, qa, wa, mb, qb, wb)
    if H == 1:
        return tl.sum(m, 0), tl.sum(q, 0)
    else:
        return _welford_tree(m, q, w, H)


@triton.jit
def _abs_max_start(xr, h, PACKED: tl.constexpr):
    """The first piece's running max |x| (_abs_max_step's accumulator): x itself when PACKED (the
    magnitudes are what counts), else |h| in fp32."""
    if PACKED:
        return xr
    else:
        return tl.abs(h)


@triton.jit
def _abs_max_step(acc, xr, h, PACKED: tl.constexpr):
    """Running max |x| per lane. PACKED (16-bit x): max.xorsign.abs on pairs, one instruction for two
    elements, in x's dtype (exact; the sign is garbage, take |acc| at the end; a NaN loses to a number,
    but such a row is flagged and recomputed); else fp32 max(acc, |h|), one instruction an element."""
    if not PACKED:
        return tl.maximum(acc, tl.abs(h))
    elif INTERPRET:
        return tl.maximum(tl.abs(acc.to(tl.float32)), tl.abs(h)).to(xr.dtype)
    elif xr.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise("max.xorsign.abs.bf16x2 $0, $1, $2;", "=r,r,r", [acc, xr], dtype=tl.bfloat16,
                                         is_pure=True, pack=2)
    else:
        return tl.inline_asm_elementwise("max.xorsign.abs.f16x2 $0, $1, $2;", "=r,r,r", [acc, xr], dtype=tl.float16,
                                         is_pure=True, pack=2)


@triton.jit
def _welford_merge_max(ma, qa, wa, xa, mb, qb, wb, xb):
    """_welford_merge with a running max riding along (the sketch's max |h|): the same merges, so the
    same mean and M2 as without it."""
    m, q, w = _welford_merge(ma, qa, wa, mb, qb, wb)
    return m, q, w, tl.maximum(xa, xb)


@triton.jit
def _layernorm_welford_kernel(
    X_ptr, X_row_stride, W_ptr, B_ptr, Y_ptr, Y_row_stride, S_ptr,  # as _layernorm_kernel
    M_ptr,  # row record words, int64 (>= 2 * n_rows,), all -1 (sketch_buffer.row_records); unused unless SKETCH
    E_ptr,  # extra records, int64 (>= n_rows, 4)
    n_rows,
    eps,  # fp32 scalar
    N: tl.constexpr,  # the row length, compiled in: a runtime length ran the piece loops 30 % slower (H200)
    CHUNK: tl.constexpr,  # twin.numerics.welford_chunk: lanes of the Welford update (part of the numerics)
    CAP: tl.constexpr,
    SKETCH: tl.constexpr,
    POLL: tl.constexpr,  # rows whose records the finisher reads at once
    EXACT_CHUNK: tl.constexpr,  # width of the pieces the cold paths read
    FINISHER_FIRST: tl.constexpr,  # program 0 finishes (a GPU starts it first); else program n_rows (the interpreter)
    PACKED: tl.constexpr,  # x is 16-bit: max |x| two elements an instruction (_abs_max_step)
    PROBE: tl.constexpr = 0,  # bench only (the sketch is then wrong), bits: 1 no max |h|, 2 no records (no polls), 4 no flagged path
):
    # A program per row, as torch.compile's layernorm: lane l runs Welford's update over elements l,
    # l + CHUNK, ... (the first piece sets mean = h, M2 = 0; every lane has the same count, so 1/count is
    # one division per piece), a tree of Chan merges gives the row's mean and M2, and a second pass
    # re-reads the row (an L2 hit) for y. Few registers a thread (no row held), so many programs per SM.
    # With the sketch each row's program stores two record words, (mean, var) and (max |h|, 0), and one
    # more program, the finisher, polls them (_common.poll_records) and derives each row's sum of
    # squares, std and |mean|/std as _slot_partials does. A row with NaN/±inf (or overflowing squares),
    # or one that could be constant, writes exact partials to its extra record and flags its second word.
    pid = tl.program_id(0)
    cols = tl.arange(0, CHUNK)
    FULL: tl.constexpr = (N // CHUNK) * CHUNK  # columns in whole pieces (N >= CHUNK)
    if not SKETCH or pid != (0 if FINISHER_FIRST else n_rows):
        row = tl.cast(pid - 1 if SKETCH and FINISHER_FIRST else pid, tl.int64)
        X_row = X_ptr + row * X_row_stride
        xr = tl.load(X_row + cols, eviction_policy="evict_last")
        mean = xr.to(tl.float32)  # count 1: mean = h, M2 = 0
        m2 = tl.zeros([CHUNK], dtype=tl.float32)
        amax = _abs_max_start(xr, mean, PACKED)  # sketch only (dead code without it)
        k = 1.0
        for c0 in tl.range(CHUNK, FULL, CHUNK):
            xr = tl.load(X_row + c0 + cols, eviction_policy="evict_last")
            h = xr.to(tl.float32)
            k += 1.0
            rc = tl.math.div_rn(1.0, k)  # one scalar per piece
            delta = h - mean
            mean = tl.fma(delta, rc, mean)
            m2 = tl.fma(delta, h - mean, m2)
            if SKETCH and PROBE % 2 == 0:
                amax = _abs_max_step(amax, xr, h, PACKED)
        cnt = tl.full([CHUNK], k, tl.float32)
        if FULL < N:  # the ragged last piece: its lanes past N keep their count
            tail = FULL + cols < N
            xr = tl.load(X_row + FULL + cols, mask=tail, other=0.0, eviction_policy="evict_last")
            h = xr.to(tl.float32)
            rc = tl.math.div_rn(1.0, k + 1.0)
            delta = h - mean
            t_mean = tl.fma(delta, rc, mean)
            m2 = tl.where(tail, tl.fma(delta, h - t_mean, m2), m2)
            mean = tl.where(tail, t_mean, mean)
            cnt = tl.where(tail, k + 1.0, cnt)
            if SKETCH:
                amax = _abs_max_step(amax, xr, h, PACKED)  # padding is 0
        if INTERPRET:  # the twin's tree (the interpreter's tl.reduce folds left); the max its own tree
            m, q = _welford_tree(mean, m2, cnt, CHUNK)
            hmax = tl.max(tl.abs(amax.to(tl.float32)), 0)
        elif SKETCH and PROBE % 2 == 0:
            m, q, _, hmax = tl.reduce((mean, m2, cnt, tl.abs(amax.to(tl.float32))), 0, _welford_merge_max)
        else:
            m, q, _ = tl.reduce((mean, m2, cnt), 0, _welford_merge)
            hmax = tl.zeros((), dtype=tl.float32)  # PROBE 1
        var = tl.math.div_rn(q, tl.cast(N, tl.float32))
        if SKETCH:  # before y: the finisher's wait ends with the last row's sums, not with its stores
            plain = ((var + m * m) * N <= FMAX) & ~_could_be_constant(m, var)
            if plain and PROBE // 2 % 2 == 0:  # the rare rest after y
                tl.store(M_ptr + row * 2, record_word(m, var))
                tl.store(M_ptr + row * 2 + 1, record_word(hmax, tl.zeros((), tl.float32)))
        rs = tl.math.rsqrt(var + eps)  # approximate rsqrt
        Y_row = Y_ptr + row * Y_row_stride
        for c0 in tl.range(0, N, CHUNK):
            cm = c0 + cols < N
            h = tl.load(X_row + c0 + cols, mask=cm, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(W_ptr + c0 + cols, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
            b = tl.load(B_ptr + c0 + cols, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
            tl.store(Y_row + c0 + cols, tl.fma((h - m) * rs, w, b).to(Y_ptr.dtype.element_ty), mask=cm,
                     eviction_policy="evict_first")
        if SKETCH and PROBE < 4:  # noqa: SIM102 - a constexpr branch
            if not plain:
                _publish_flagged_row(X_row, M_ptr + row * 2 + 1, E_ptr + row * 4, N, CAP, EXACT_CHUNK)
    else:  # the finisher: the parameters' partials while rows run, then the records in row order
        param_nf = _param_features(W_ptr, B_ptr, S_ptr, tl.arange(0, EXACT_CHUNK), N, EXACT_CHUNK)
        v_amax = tl.zeros([POLL], dtype=tl.float32)  # per row slot across the polls, reduced at the end
        v_sq = tl.zeros([POLL], dtype=tl.float64)
        v_ratio = tl.zeros([POLL], dtype=tl.float32)
        v_minstd = tl.full([POLL], float("inf"), tl.float32)
        g_amax = tl.zeros((), dtype=tl.float32)  # the flagged rows' partials
        g_sq = tl.zeros((), dtype=tl.float64)
        g_ratio = tl.zeros((), dtype=tl.float32)
        g_minstd = tl.full((), float("inf"), tl.float32)
        g_const = tl.zeros((), dtype=tl.float32)
        g_nf = tl.zeros((), dtype=tl.int64)
        for r0 in range(0, n_rows if PROBE // 2 % 2 == 0 else 0, POLL):
            lo, hi = poll_records(M_ptr, r0, n_rows, POLL, 2)
            m_bits, amax_bits = tl.split(lo)  # word 0 = (mean, var), word 1 = (max |h|, 0 or the flag)
            var_bits, tag = tl.split(hi)
            rows = r0 + tl.arange(0, POLL)
            flagged = tag == RECORD_FLAG_HI
            plain = (rows < n_rows) & ~flagged
            m = m_bits.to(tl.float32, bitcast=True)
            var = var_bits.to(tl.float32, bitcast=True)
            sf = tl.sqrt(var)
            v_amax = tl.maximum(v_amax, tl.where(plain, amax_bits.to(tl.float32, bitcast=True), 0.0))
            v_sq += tl.where(plain, (var + m * m) * N, 0.0).to(tl.float64)  # as _slot_partials
            v_ratio = tl.maximum(v_ratio, tl.where(plain, _ratio(m, sf, -1.0, CAP), 0.0))
            v_minstd = tl.minimum(v_minstd, tl.where(plain, sf, float("inf")))
            r = tl.min(tl.where(flagged, rows, n_rows), axis=0)
            while r < n_rows:  # rare: the flagged rows one by one
                e = E_ptr + r * 4 * acquire_flag(M_ptr + r * 2 + 1)
                a_bits, nf_bits = record_halves(tl.load(e, volatile=True))
                ratio_bits, sf_bits = record_halves(tl.load(e + 2, volatile=True))
                c_bits, _ = record_halves(tl.load(e + 3, volatile=True))
                g_amax = tl.maximum(g_amax, a_bits.to(tl.float32, bitcast=True))
                g_sq += tl.load(e + 1, volatile=True).to(tl.float64, bitcast=True)
                g_ratio = tl.maximum(g_ratio, ratio_bits.to(tl.float32, bitcast=True))
                g_minstd = tl.minimum(g_minstd, sf_bits.to(tl.float32, bitcast=True))
                g_const = tl.maximum(g_const, c_bits.to(tl.float32, bitcast=True))
                g_nf += nf_bits.to(tl.float32, bitcast=True).to(tl.int64)
                r = tl.min(tl.where(flagged & (rows > r), rows, n_rows), axis=0)
        m_amax, s_sq, m_ratio = max_sum_max(v_amax, v_sq, v_ratio)
        numel = tl.cast(n_rows, tl.int64) * N
        store_common_features(S_ptr, numel, tl.cast(n_rows, tl.int64), tl.maximum(m_amax, g_amax).to(tl.float64),
                              s_sq + g_sq, numel - g_nf, g_nf + param_nf)
        tl.store(S_ptr + 5, tl.cast(N, tl.float64))
        _store_own_features(S_ptr, tl.maximum(m_ratio, g_ratio).to(tl.float64),
                            tl.minimum(tl.min(v_minstd, axis=0), g_minstd).to(tl.float64), g_const.to(tl.float64),
                            n_rows, CAP)


@triton.jit
def _publish_flagged_row(X_row, flag_ptr, E_row, n_cols, CAP: tl.constexpr, CHUNK: tl.constexpr):
    """A row the finisher cannot derive from (mean, var) (NaN/±inf, overflowing squares, or one that
    could be constant): its exact finite-only partials (_chunked_exact_row, float64 sums) into its
    extra record (max |h| | NaN/±inf count, sum of squares float64, |mean|/std | std, constant |c| or
    -1), then the flag on its second word (the first gets a non-sentinel word: the finisher waits for
    both)."""
    amax, sq, nf, mf, sf, c = _chunked_exact_row(X_row, tl.arange(0, CHUNK), n_cols, CHUNK)
    tl.store(E_row, record_word(amax, nf))
    tl.store(E_row + 1, sq.to(tl.int64, bitcast=True))
    tl.store(E_row + 2, record_word(_ratio(mf, sf, c, CAP), sf))
    tl.store(E_row + 3, record_word(c, tl.zeros((), tl.float32)))
    tl.store(flag_ptr - 1, record_word(tl.zeros((), tl.float32), tl.zeros((), tl.float32)))
    release_flag(flag_ptr)


# ------------------------------------------------------------------ rows longer than MAX_BLOCK


@triton.jit
def _chunked_mean_var(X_row, cols, n_cols, CHUNK: tl.constexpr, CONST_N: tl.constexpr):
    """(mean, population variance) of one row read in CHUNK pieces, as the twin's order "blocked"
    (lanes = CHUNK): per-lane fp32 sums in sequence over the chunks, one tl.sum tree, IEEE divide.
    Pass 1 reads DRAM (default eviction: the row stays in L2), pass 2 re-reads L2. CONST_N > 0: the
    row length as a compile-time multiple of CHUNK (no masks, a known trip count; the bench's option)."""
    n_loop = CONST_N if CONST_N > 0 else n_cols
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    for c0 in tl.range(0, n_loop, CHUNK):
        cm = None if CONST_N > 0 else c0 + cols < n_cols  # no mask with CONST_N
        acc += tl.load(X_row + c0 + cols, mask=cm, other=None if CONST_N > 0 else 0.0).to(tl.float32)
    m = tl.math.div_rn(tl.sum(acc, axis=0), tl.cast(n_cols, tl.float32))
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    for c0 in tl.range(0, n_loop, CHUNK):
        if CONST_N > 0:
            d = tl.load(X_row + c0 + cols).to(tl.float32) - m
        else:
            cm = c0 + cols < n_cols
            d = tl.where(cm, tl.load(X_row + c0 + cols, mask=cm, other=0.0).to(tl.float32) - m, 0.0)
        acc += d * d
    return m, tl.math.div_rn(tl.sum(acc, axis=0), tl.cast(n_cols, tl.float32))


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


@triton.jit
def _layernorm_chunked_kernel(
    X_ptr, X_row_stride, W_ptr, B_ptr, Y_ptr, Y_row_stride, S_ptr, F_ptr, I_ptr,  # as _layernorm_kernel
    n_rows,
    n_cols,
    eps,  # fp32 scalar
    CAP: tl.constexpr,
    CHUNK: tl.constexpr,  # elements per load; rows are read in ceil(n / CHUNK) pieces, three times
    SKETCH: tl.constexpr,
    CONST_N: tl.constexpr,  # 0, or n_cols as a compile-time multiple of CHUNK (_chunked_mean_var)
):
    # Three passes per row (sum; squared deviations; normalize and store): the first from DRAM, the
    # others from L2. Slower than a row held in registers where one fits (bench/norm_chunks.py), so
    # only rows past MAX_BLOCK.
    pid = tl.program_id(0)
    cols = tl.arange(0, CHUNK)
    if SKETCH:
        p_ratio = tl.zeros((), dtype=tl.float32)
        p_minstd = tl.full((), float("inf"), tl.float32)
        p_sq = tl.zeros((), dtype=tl.float64)
        p_nf = tl.zeros((), dtype=tl.int64)
        p_const = tl.full((), -1.0, tl.float32)
        p_bad = tl.zeros((), dtype=tl.int32)
        a_amax = tl.zeros([CHUNK], dtype=tl.float32)  # per lane: max |h| over the program's rows
    for r in tl.range(pid, n_rows, tl.num_programs(0)):
        x_row = X_ptr + tl.cast(r, tl.int64) * X_row_stride
        m, var = _chunked_mean_var(x_row, cols, n_cols, CHUNK, CONST_N)
        rs = tl.math.rsqrt(var + eps)  # approximate rsqrt
        for c0 in tl.range(0, CONST_N if CONST_N > 0 else n_cols, CHUNK):
            cm = None if CONST_N > 0 else c0 + cols < n_cols  # no mask with CONST_N
            zero = None if CONST_N > 0 else 0.0
            h = tl.load(x_row + c0 + cols, mask=cm, other=zero, eviction_policy="evict_first").to(tl.float32)
            if SKETCH:  # NaN/±inf rows fail the row test below and are redone after the loop
                a_amax = tl.maximum(a_amax, tl.abs(h))
            w = tl.load(W_ptr + c0 + cols, mask=cm, other=zero, eviction_policy="evict_last").to(tl.float32)
            b = tl.load(B_ptr + c0 + cols, mask=cm, other=zero, eviction_policy="evict_last").to(tl.float32)
            tl.store(Y_ptr + tl.cast(r, tl.int64) * Y_row_stride + c0 + cols,
                     ((h - m) * rs * w + b).to(Y_ptr.dtype.element_ty), mask=cm, eviction_policy="evict_first")
        if SKETCH:  # per row scalars from the op's own mean and variance
            sq = (var + m * m) * n_cols  # = sum h*h (positive terms, no cancellation)
            ok = sq <= FMAX  # every entry finite (NaN/±inf make m, var NaN)
            sf = tl.sqrt(var)
            cabs = _const_abs(x_row, cols, n_cols, m, var, CHUNK)
            p_ratio = tl.maximum(p_ratio, tl.where(ok, _ratio(m, sf, cabs, CAP), 0.0))
            p_minstd = tl.minimum(p_minstd, tl.where(ok, sf, float("inf")))
            p_sq += tl.where(ok, sq, 0.0).to(tl.float64)
            p_const = tl.maximum(p_const, tl.where(ok, cabs, -1.0))
            p_bad += tl.where(ok, 0, 1)
    if SKETCH:
        p_amax = tl.max(a_amax, axis=0)
        if p_bad > 0:  # rare: the lanes saw NaN/±inf; redo this program's max and its bad rows exactly
            p_amax = tl.zeros((), dtype=tl.float32)
            for r2 in tl.range(pid, n_rows, tl.num_programs(0)):
                x_row = X_ptr + tl.cast(r2, tl.int64) * X_row_stride
                m2, var2 = _chunked_mean_var(x_row, cols, n_cols, CHUNK, CONST_N)  # the loop's own values and test
                if not ((var2 + m2 * m2) * n_cols <= FMAX):
                    amax2, sq2, nf2, mf2, sf2, c2 = _chunked_exact_row(x_row, cols, n_cols, CHUNK)
                    p_amax, p_ratio, p_minstd, p_sq, p_nf, p_const = _merge_row(
                        p_amax, p_ratio, p_minstd, p_sq, p_nf, p_const, amax2, sq2, nf2, mf2, sf2, c2, CAP)
                else:
                    for c0 in tl.range(0, n_cols, CHUNK):
                        hc = tl.load(x_row + c0 + cols, mask=c0 + cols < n_cols, other=0.0).to(tl.float32)
                        p_amax = tl.maximum(p_amax, tl.max(tl.abs(hc), axis=0))  # padding is 0
        if pid == tl.num_programs(0) - 1:  # the parameters' partials: the last program has the fewest rows
            _param_partials(W_ptr, B_ptr, S_ptr, I_ptr, cols, n_cols, CHUNK)
        _publish(S_ptr, F_ptr, I_ptr, p_amax, p_sq, p_ratio, p_minstd, p_nf, p_const, n_rows, n_cols, CAP)


def _layernorm_launch(
    x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y2: torch.Tensor,
    buf: torch.Tensor | None, eps: float, num_warps: int | None = None, stages: int | None = None,
    per_sm: int | None = None, keep: int | None = None, chunk: int | None = None, maxnreg: int | None = None,
    const_n: bool = False, welford: bool | None = None, poll: int | None = None, probe: int = 0,
    welford_chunk: int | None = None,
) -> None:
    """Rows twin.numerics.welford_chunk takes: the Welford kernel, a program per row (_welford_launch;
    `welford` forces it on or off, `welford_chunk` its chunk, `poll` its finisher's poll, `probe` the
    bench's timing knob). Otherwise one
    persistent program per resident slot (persistent_grid), each over its share of rows; without the
    sketch one program per row where _common.ROW_GRID lists the launch.
    Rows longer than MAX_BLOCK (or than `chunk`, the bench's comparison) go to the three-pass chunked
    kernel, TRITON_CHUNK wide by default (part of the numerics: the twin's lanes).
    num_warps / stages / per_sm / keep / chunk / maxnreg (registers per thread) / const_n (the chunked
    kernel compiled for this row length) override the tuned launch (the bench's sweep; num_warps
    changes the tl.sum trees; any but num_warps takes the row-in-registers kernels)."""
    n_rows, n = x2.shape
    sketch = buf is not None
    if n_rows == 0 and not sketch:
        return
    overrides = (stages, per_sm, keep, chunk)
    if (_welford_rule(n) and all(o is None for o in overrides) if welford is None else welford):
        _welford_launch(x2, weight, bias, y2, buf, eps, num_warps, poll, maxnreg, probe, welford_chunk)
        return
    f, i = workspace("layernorm", x2.device) if sketch else (y2, y2)
    if n > MAX_BLOCK or (chunk is not None and n > chunk):
        block, warps, _, _ = launch_config("layernorm-chunked", n, num_warps, 1, chunk=chunk or TRITON_CHUNK)
        key = ("layernorm-chunked", x2.dtype, block, warps, sketch, const_n)
        k = _layernorm_chunked_kernel[(persistent_grid(key, n_rows, x2.device, per_sm),)](
            x2, x2.stride(0), weight, bias, y2, y2.stride(0), buf if sketch else y2, f, i,
            n_rows, n, eps, CAP=RATIO_CAP, CHUNK=block, SKETCH=sketch, CONST_N=n if const_n and n % block == 0 else 0,
            num_warps=warps, enable_fp_fusion=False,
        )
        note_occupancy(key, k, warps)
        return
    block, warps, st, cap = launch_config("layernorm", n, num_warps, stages, maxnreg=maxnreg, sketch=sketch)
    vec, lanes = lane_shape(block, x2.element_size(), warps)
    kp = min(KEEP if keep is None else keep, vec)
    key = ("layernorm", x2.dtype, block, warps, st, cap, sketch, kp)
    regs = register_cap(cap)  # registers per thread
    grid = persistent_grid(key, n_rows, x2.device, grid_per_sm("layernorm", block, sketch, per_sm))
    k = _layernorm_kernel[(grid,)](
        x2, x2.stride(0), weight, bias, y2, y2.stride(0), buf if sketch else y2, f, i,
        n_rows, n, eps, CAP=RATIO_CAP, BLOCK=block, SKETCH=sketch, STAGES=st, VEC=vec, LANES=lanes, KEEP=kp,
        EXACT_CHUNK=min(EXACT_CHUNK, block),
        num_warps=warps, enable_fp_fusion=False, **regs,
    )
    note_occupancy(key, k, warps)


def _welford_launch(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y2: torch.Tensor,
                    buf: torch.Tensor | None, eps: float, num_warps: int | None = None, poll: int | None = None,
                    maxnreg: int | None = None, probe: int = 0, welford_chunk: int | None = None) -> None:
    """_layernorm_welford_kernel: a program per row (and the finisher with the sketch), the row length
    compiled in (one kernel per hidden size, as torch.compile specializes). poll: rows whose records
    the finisher reads at once (a power of two; tests put flagged rows across its boundaries)."""
    n_rows, n = x2.shape
    # another chunk (or a ragged one) is not the catalog variant's numerics: the bench's sweep and tests
    chunk = welford_chunk or _welford_rule(n) or 4096
    if n < chunk or n > MAX_BLOCK:
        raise InputError(f"layernorm: the Welford launch takes rows of {chunk}..{MAX_BLOCK}, got {n}")
    sketch = buf is not None
    warps = num_warps or max(1, chunk // (32 * ELEMS_PER_THREAD))
    cap = (WELFORD_REG_CAP if sketch else None) if maxnreg is None else maxnreg or None
    m, e = row_records("layernorm", x2.device, n_rows, words=2, extra=4) if sketch else (y2, y2)
    k = _layernorm_welford_kernel[(n_rows + sketch,)](
        x2, x2.stride(0), weight, bias, y2, y2.stride(0), buf if sketch else y2, m, e, n_rows, eps,
        N=n, CHUNK=chunk, CAP=RATIO_CAP, SKETCH=sketch, POLL=poll or RECORD_POLL, EXACT_CHUNK=_common.EXACT_CHUNK,
        FINISHER_FIRST=not INTERPRETED, PACKED=x2.element_size() == 2, PROBE=probe, num_warps=warps, enable_fp_fusion=False, **register_cap(cap),
        **({} if INTERPRETED else {"num_stages": 1}),
    )
    note_occupancy(("layernorm-welford", x2.dtype, n, chunk, warps, cap, sketch), k, warps)


def layernorm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = EPS, sketch: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(layer norm of x over the last dim with weight and bias, sketch features or None), x's dtype.

    Read the features with optwin.kernels.read_sketch("layernorm", buf).
    """
    check_device(x, weight, bias)
    x2 = rows_view(x)  # (rows, hidden)
    y2 = torch.empty(x2.shape, dtype=x.dtype, device=x.device)  # (rows, hidden)
    buf = new_buffer("layernorm", x.device) if sketch else None
    _layernorm_launch(x2, weight.contiguous(), bias.contiguous(), y2, buf, float(eps))
    return y2.reshape(x.shape), buf
