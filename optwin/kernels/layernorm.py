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
Rows of 4096..65536 that a chunk of 4096, 2048 or 1024 divides into at least 3 pieces
(twin.numerics.welford_chunk) take the Welford kernel instead: optwin.kernels.layernorm_welford.
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
from optwin.kernels._common import (
    FMAX,
    MAX_BLOCK,
    aligned_rows,
    check_device,
    check_rows,
    column_multiple,
    grid_per_sm,
    lane_max,
    lane_shape,
    launch_config,
    persistent_grid,
    register_cap,
    rows_view,
    store_cast,
    sum_squares,
)
from optwin.kernels.launch_plan import Plan, kept, plan, run
from optwin.kernels.layernorm_sketch import (
    _chunked_exact_row,
    _const_abs,
    _const_of,
    _could_be_constant,
    _merge_row,
    _param_partials,
    _publish,
    _ratio,
    _slot_partials,
)
from optwin.kernels.layernorm_welford import _welford_launch
from optwin.kernels.sketch_buffer import (
    RATIO_CAP,
    WORKSPACE,
    feature_names,
    new_buffer,
    workspace,
)
from optwin.twin.numerics import TRITON_CHUNK
from optwin.twin.numerics import welford_chunk as _welford_rule

# Columns per piece of the exact pass after the row loop: small, so the rare pass adds few registers
# to the kernel (the loop's row is not held for it).
EXACT_CHUNK = 256
EPS = CATALOG["layernorm"].constants["eps"]
KEEP = 1  # max |x| chains per lane: [LANES, KEEP] registers (KEEP 8 measured the same, 89.3 µs)
assert feature_names("layernorm") == (
    "numel", "rows", "absmax", "rms", "nonfinite", "hidden", "max_mean_over_std", "min_row_std", "weight_absmax",
    "bias_absmax", "const_absmax")
assert [n for n, _ in WORKSPACE["layernorm"][0]] == ["absmax", "sumsq", "max_ratio", "min_std", "const_absmax"]
assert WORKSPACE["layernorm"][1] == ("ticket", "nonfinite", "param_nonfinite")


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
    ALIGN: tl.constexpr = 1,  # n_cols and both row strides are multiples of it (_common.column_multiple)
):
    # Persistent: programs walk rows pid, pid + grid, ...; each row is still reduced by one program
    # in one tree (numerics independent of the grid).
    pid = tl.program_id(0)
    n_cols, X_row_stride, Y_row_stride = aligned_rows(n_cols, X_row_stride, Y_row_stride, ALIGN)
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
        tl.store(Y_ptr + row * Y_row_stride + cols, store_cast(y, Y_ptr.dtype.element_ty), mask=mask,
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
def _layernorm_chunked_kernel(
    X_ptr, X_row_stride, W_ptr, B_ptr, Y_ptr, Y_row_stride, S_ptr, F_ptr, I_ptr,  # as _layernorm_kernel
    n_rows,
    n_cols,
    eps,  # fp32 scalar
    CAP: tl.constexpr,
    CHUNK: tl.constexpr,  # elements per load; rows are read in ceil(n / CHUNK) pieces, three times
    SKETCH: tl.constexpr,
    CONST_N: tl.constexpr,  # 0, or n_cols as a compile-time multiple of CHUNK (_chunked_mean_var)
    ALIGN: tl.constexpr = 1,  # n_cols and the row strides are multiples of it (_common.column_multiple)
):
    # Three passes per row (sum; squared deviations; normalize and store): the first from DRAM, the
    # others from L2. Slower than a row held in registers where one fits (bench/norm_chunks.py), so
    # only rows past MAX_BLOCK.
    pid = tl.program_id(0)
    n_cols, X_row_stride, Y_row_stride = aligned_rows(n_cols, X_row_stride, Y_row_stride, ALIGN)
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
                     store_cast((h - m) * rs * w + b, Y_ptr.dtype.element_ty), mask=cm, eviction_policy="evict_first")
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
    welford_chunk: int | None = None, prefetch: float | None = None, packed: bool | None = None,
    timestamps: torch.Tensor | None = None, defer: bool = False,
) -> torch.Tensor | None:
    """Rows twin.numerics.welford_chunk takes: the Welford kernel, a program per row (_welford_launch;
    `welford` forces it on or off, `welford_chunk` its chunk, `poll` its finisher's poll, `probe` the
    bench's timing knob, `prefetch` its rows of L2 prefetch ahead, `packed` its max |x| on element
    pairs or not, `timestamps` PROBE 131072's stamps, `defer` (with buf None) its records finished later,
    batched with other calls': optwin.kernels.deferred; the other launches then sketch in the launch). Otherwise one
    persistent program per resident slot (persistent_grid), each over its share of rows; without the
    sketch one program per row where _common.ROW_GRID lists the launch.
    Rows longer than MAX_BLOCK (or than `chunk`, the bench's comparison) go to the three-pass chunked
    kernel, TRITON_CHUNK wide by default (part of the numerics: the twin's lanes).
    num_warps / stages / per_sm / keep / chunk / maxnreg (registers per thread) / const_n (the chunked
    kernel compiled for this row length) override the tuned launch (the bench's sweep; num_warps
    changes the tl.sum trees; any but num_warps takes the row-in-registers kernels). The launch is worked
    out once per key (launch_plan). Returns the buffer the sketch goes to (buf, or with defer a pending page
    buffer or a new one) or None."""
    n_rows, n = x2.shape
    if defer and buf is not None:
        raise InputError("layernorm: defer makes its own sketch buffer; pass buf=None")
    sketch = buf is not None or defer
    if n_rows == 0 and not sketch:
        return buf
    overrides = (stages, per_sm, keep, chunk)
    if (_welford_rule(n) and all(o is None for o in overrides) if welford is None else welford):
        return _welford_launch(x2, weight, bias, y2, buf, eps, num_warps, poll, maxnreg, probe, welford_chunk,
                               prefetch, packed, timestamps, defer)
    buf = new_buffer("layernorm", x2.device) if defer else buf
    if timestamps is not None:
        raise InputError("layernorm: timestamps (PROBE 131072) are the Welford launch's only")
    xs, ys = x2.stride(0), y2.stride(0)
    key = ("layernorm", x2.shape, xs, ys, x2.data_ptr() & 15, x2.dtype, weight.dtype, bias.dtype,
           y2.dtype, x2.device, sketch, num_warps, stages, per_sm, keep, chunk, maxnreg, const_n)
    p = kept(key) or _layernorm_plan(x2, y2, sketch, num_warps, stages, per_sm, keep, chunk, maxnreg, const_n)
    f, i = workspace("layernorm", x2.device) if sketch else (y2, y2)
    run(key, p, (x2, xs, weight, bias, y2, ys, buf if sketch else y2, f, i, n_rows, n, eps))
    return buf


def _layernorm_plan(x2: torch.Tensor, y2: torch.Tensor, sketch: bool, num_warps: int | None, stages: int | None,
                    per_sm: int | None, keep: int | None, chunk: int | None, maxnreg: int | None,
                    const_n: bool) -> Plan:
    """_layernorm_launch's kernel, grid and options (rows the Welford kernel does not take) for this call's
    shape, strides, dtype and overrides."""
    n_rows, n = x2.shape
    if n > MAX_BLOCK or (chunk is not None and n > chunk):
        block, warps, _, _ = launch_config("layernorm-chunked", n, num_warps, 1, chunk=chunk or TRITON_CHUNK)
        align = column_multiple(n, x2.stride(0), y2.stride(0))
        key = ("layernorm-chunked", x2.dtype, block, warps, sketch, const_n, align)
        return plan(_layernorm_chunked_kernel, (persistent_grid(key, n_rows, x2.device, per_sm),),
                    {"CAP": RATIO_CAP, "CHUNK": block, "SKETCH": sketch,
                     "CONST_N": n if const_n and n % block == 0 else 0, "ALIGN": align, "num_warps": warps,
                     "enable_fp_fusion": False}, key, warps)
    block, warps, st, cap = launch_config("layernorm", n, num_warps, stages, maxnreg=maxnreg, sketch=sketch,
                                   esize=x2.element_size())
    vec, lanes = lane_shape(block, x2.element_size(), warps)
    kp = min(KEEP if keep is None else keep, vec)
    align = column_multiple(n, x2.stride(0), y2.stride(0))
    key = ("layernorm", x2.dtype, block, warps, st, cap, sketch, kp, align)
    grid = persistent_grid(key, n_rows, x2.device, grid_per_sm("layernorm", block, sketch, per_sm))
    return plan(_layernorm_kernel, (grid,),
                {"CAP": RATIO_CAP, "BLOCK": block, "SKETCH": sketch, "STAGES": st, "VEC": vec, "LANES": lanes,
                 "KEEP": kp, "EXACT_CHUNK": min(EXACT_CHUNK, block), "ALIGN": align, "num_warps": warps,
                 "enable_fp_fusion": False, **register_cap(cap)}, key, warps)


_ZERO_BIAS: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}


def _zero_bias(weight: torch.Tensor) -> torch.Tensor:
    """A zero bias like weight, made once per (length, dtype, device): a bias-free model's every call
    would otherwise launch a fill kernel for it."""
    key = (weight.shape[-1] if weight.ndim else 1, weight.dtype, weight.device)
    if key not in _ZERO_BIAS:
        _ZERO_BIAS[key] = torch.zeros(key[0], dtype=weight.dtype, device=weight.device)
    return _ZERO_BIAS[key]


def layernorm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float = EPS, sketch: bool = True,
    defer: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(layer norm of x over the last dim with weight and bias, sketch features or None), x's dtype.
    bias None is a zero bias (nn.LayerNorm(bias=False)): the same y as x*w + 0 in the kernel's fma.

    Read the features with optwin.kernels.read_sketch("layernorm", buf). defer: where the launch runs a
    program per row (the Welford launch), its finisher runs later, batched with other calls'
    (optwin.kernels.deferred); buf is then pending until read_sketch or deferred.settle_all().
    """
    if bias is None:
        bias = _zero_bias(weight)
    check_device(x, weight, bias)
    check_rows("layernorm", x, weight=weight, bias=bias)
    x2 = rows_view(x)  # (rows, hidden)
    y2 = torch.empty(x2.shape, dtype=x.dtype, device=x.device)  # (rows, hidden)
    buf = new_buffer("layernorm", x.device) if sketch and not defer else None
    buf = _layernorm_launch(x2, weight.contiguous(), bias.contiguous(), y2, buf, float(eps), defer=sketch and defer)
    return y2.reshape(x.shape), buf
