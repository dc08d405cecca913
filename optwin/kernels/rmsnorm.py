"""RMSNorm in Triton, with the input sketch in the same launch (catalog variant rmsnorm/triton).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.rmsnorm import rmsnorm; \
print(rmsnorm(torch.randn(3, 8), torch.ones(8))[1])"

Numerics (what optwin.twin's rmsnorm/triton models), per row of n = hidden elements:
    h = x.float()                      # exact
    v = sum_squares(h) / n             # each 4 neighbours' squares folded with FMAs (one rounding per step),
                                       # then an fp32 tree (tl.sum) over the BLOCK/4 partials; IEEE fp32 division
    r = rsqrt(v + eps)                 # eps as an fp32 scalar; rsqrt is approximate (rsqrt.approx.f32
                                       # on NVIDIA, ~2 ulp), the interpreter uses 1/sqrt in numpy
    y = (h * r * w.float()).to(dtype)  # fp32 products left to right, one rounding to dtype
Rows longer than MAX_BLOCK (65536) go to a two-pass kernel over TRITON_CHUNK-wide pieces: v is then
one fp32 accumulator per lane summed over the pieces, then the tree (the twin's order "blocked").
Compiled without FMA contraction (enable_fp_fusion=False), with the FMAs written out
(_common.sum_squares): with contraction on, LLVM fused a different half of the tree's products into
FMAs once the sketch added uses of h (H200, 2026-11: y changed at 1823x781), so the sketch changed y.
Written out, the FMAs are the same in both variants and the twin knows each rounding; they cut the
sum's instructions from 2 to 1.25 per element: H200, 4096x16384 bf16, 73.7 -> 73.0 µs without the
sketch, 76.0 -> 75.0 with it (bench/results/norm_chunks_h200_s14f.md; Inductor's own kernel lost
1.9 µs with contraction off, bench/results/rmsnorm_bisect_h200_s14.md).
With the sketch on, max |h| is one extra tl.max per row (a separate tree: the op's sum is the same,
so y is bit-identical with and without the sketch).
Sketch per row from the op's own sums: sumsq = sum_squares(h), row mean square = v; only a row whose
sum is not finite (NaN/±inf, or h*h overflow) recomputes exact finite-only partials.
Memory: read rows*n (x, evict-first) + n per row (weight, an L1/L2 hit), write rows*n (y); with
the sketch a few scalar atomics per program and the feature vector.

Launches (_rmsnorm_launch): where _common.ROW_GRID lists the row width (blocks 4096, 8192, 16384), one
program per row in _rmsnorm_rows_kernel, with the sketch in row records: each row's program stores
one 64-bit word (max |h|, its fp32 sum of squares), and one more program, started first, polls the
words in row order and writes the features (_common.poll_records). No ticket and no release per
program, which cost a program-per-row launch +25 % (stop 17). H200, bf16 4096x16384, µs with L2
flushed / CUDA graph (bench/results/timing_modes_h200_s18.md): without the sketch 69.9 / 66.8
(torch.compile 70.5 / 68.0), with it 73.4 / 66.8; the persistent sketched launch 75.4 / 71.9. At
16384x4096 and 8192x8192: _common.ROW_GRID's note. Elsewhere the persistent kernels below.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.catalog import CATALOG
from optwin.kernels._common import (
    EXACT_CHUNK,
    FMAX,
    INTERPRETED,
    MAX_BLOCK,
    RECORD_FLAG_HI,
    RECORD_POLL,
    RECORD_STAGES,
    ROW_GRID,
    acquire_flag,
    aligned_rows,
    check_device,
    check_rows,
    column_multiple,
    finish_norm_sketch,
    finite_partials,
    finite_partials_chunked,
    grid_per_sm,
    last_program,
    launch_config,
    max_sum_max,
    persistent_grid,
    poll_records,
    prefetch_args,
    prefetch_row,
    read_slot,
    record_halves,
    record_word,
    register_cap,
    release_flag,
    rows_view,
    store_cast,
    store_common_features,
    sum_and_max,
    sum_squares,
)
from optwin.kernels.launch_plan import Plan, kept, plan, run
from optwin.kernels.sketch_buffer import (
    WORKSPACE,
    feature_names,
    new_buffer,
    row_records,
    workspace,
)
from optwin.twin.numerics import TRITON_CHUNK

EPS = CATALOG["rmsnorm"].constants["eps"]
# max |x| stays a per-row tree: per-lane maxima across the row loop (_common.lane_max, as layernorm
# has) were measured and dropped. 4096x16384 bf16, 8 warps 2 stages, µs without/with the sketch
# (bench/results/sketch_lanes_h200_s11b.md): per-row tree 75.9/78.5, lane max 75.9/79.3 (KEEP 8: 75.3/79.5).
# Offline (triton 3.9, bench/offline_compile.py) the sketch kernel takes 173-205 registers at 8 warps,
# 114 without the sketch: its cold paths (the weight's partials, the exact pass) hold a whole row of
# partials. In 256-wide pieces shared across the programs it takes 124 offline, and measured the same
# on the H200: 75.7 against 75.8 µs with the sketch (bench/results/norm_chunks_h200_s13d.md), because
# the device's triton 3.6 already fits the shipped kernel in 2 programs per SM; not kept.
assert feature_names("rmsnorm") == (
    "numel", "rows", "absmax", "rms", "nonfinite", "hidden", "max_row_rms", "weight_absmax")
assert [n for n, _ in WORKSPACE["rmsnorm"][0]] == ["absmax", "sumsq", "max_row_ms"]
assert WORKSPACE["rmsnorm"][1] == ("ticket", "nonfinite", "weight_nonfinite")


@triton.jit
def _publish(S_ptr, F_ptr, I_ptr, p_amax, p_sq, p_ms, p_nf, n_rows, n_cols):
    """Merge one program's sketch partials into the workspace; the last program writes the features."""
    tl.atomic_max(F_ptr + 0, p_amax.to(tl.float64), sem="relaxed")
    tl.atomic_add(F_ptr + 1, p_sq, sem="relaxed")
    tl.atomic_max(F_ptr + 2, p_ms.to(tl.float64), sem="relaxed")
    tl.atomic_add(I_ptr + 1, p_nf, sem="relaxed")
    if last_program(I_ptr):  # read back and reset the workspace, write the features
        g_ms = read_slot(F_ptr + 2)
        finish_norm_sketch(S_ptr, F_ptr, I_ptr, n_rows, n_cols)
        tl.store(S_ptr + 6, tl.sqrt(g_ms))


@triton.jit
def _merge_row(p_amax, p_ms, p_sq, p_bad, ss, amax, v):
    """One row's sketch partials from the op's own sums (ss = sum h*h, v = its mean) when every entry
    is finite (ss <= FMAX); a row with NaN/±inf (or h*h overflow) only counts as left to the exact pass."""
    ok = ss <= FMAX
    return (tl.maximum(p_amax, tl.where(ok, amax, 0.0)), tl.maximum(p_ms, tl.where(ok, v, 0.0).to(tl.float64)),
            p_sq + tl.where(ok, ss, 0.0).to(tl.float64), p_bad + tl.where(ok, 0, 1))


@triton.jit
def _merge_exact(p_amax, p_ms, p_sq, p_nf, a, q, nf, n_cols):
    """One row's exact finite-only partials (finite_partials: max |h|, sum h*h in float64, NaN/±inf
    count) merged; the mean square stays float64 (a finite row's can pass FMAX)."""
    return (tl.maximum(p_amax, a), tl.maximum(p_ms, q / tl.maximum(n_cols - nf, 1.0)), p_sq + q.to(tl.float64),
            p_nf + nf.to(tl.int64))


@triton.jit
def _normalize_store(h, ss, W_ptr, Y_row, cols, mask, n_cols, eps):
    """y = (h * rsqrt(ss / n + eps)) * w stored at Y_row, in its dtype: the op's numerics for the
    persistent kernel; the one-row kernel writes the same lines out (see there), and y is bit-identical
    between the two (tests/test_kernels_row_grid.py). Returns v = ss / n."""
    v = tl.math.div_rn(ss, tl.cast(n_cols, tl.float32))  # IEEE divide, as the twin models (`/` is div.full.f32)
    rs = tl.math.rsqrt(v + eps)  # approximate rsqrt
    # the weight per row (L1/L2 hit): holding it in registers across rows halves occupancy
    w = tl.load(W_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    y = h * rs * w  # (h*r)*w in fp32
    tl.store(Y_row + cols, store_cast(y, Y_row.dtype.element_ty), mask=mask, eviction_policy="evict_first")  # write n
    return v


@triton.jit
def _rmsnorm_kernel(
    X_ptr,  # x as (n_rows, n_cols) in dtype, last dim contiguous
    X_row_stride,
    W_ptr,  # weight (n_cols,) in dtype
    Y_ptr,  # y as (n_rows, n_cols) in dtype, contiguous
    Y_row_stride,
    S_ptr,  # sketch features, float64 (8,); unused unless SKETCH
    F_ptr,  # workspace float64 slots (absmax, sumsq, max row mean square)
    I_ptr,  # workspace int64 slots (ticket, nonfinite x, nonfinite weight)
    n_rows,
    n_cols,
    eps,  # fp32 scalar
    BLOCK: tl.constexpr,
    SKETCH: tl.constexpr,
    STAGES: tl.constexpr,  # loads in flight in the row loop (1: none ahead; >1: async copies)
    ALIGN: tl.constexpr = 1,  # n_cols and both row strides are multiples of it (_common.column_multiple)
):
    # Persistent: one program per resident slot walks rows pid, pid + grid, ...; each row is still
    # reduced by one program in one tree, so the numerics do not depend on the grid.
    pid = tl.program_id(0)
    n_cols, X_row_stride, Y_row_stride = aligned_rows(n_cols, X_row_stride, Y_row_stride, ALIGN)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if SKETCH:
        p_amax = tl.zeros((), dtype=tl.float32)  # largest finite |x| of this program's rows
        p_ms = tl.zeros((), dtype=tl.float64)  # largest row mean square (finite entries; float64: it can pass FMAX)
        p_sq = tl.zeros((), dtype=tl.float64)  # sum of finite x^2
        p_nf = tl.zeros((), dtype=tl.int64)  # NaN/±inf count
        p_bad = tl.zeros((), dtype=tl.int32)  # rows left to the exact pass after the loop
    for r in tl.range(pid, n_rows, tl.num_programs(0), num_stages=STAGES):
        row = tl.cast(r, tl.int64)  # 64-bit offsets for tensors past 2^31 elements
        x = tl.load(X_ptr + row * X_row_stride + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        h = x.to(tl.float32)
        ss = sum_squares(h, BLOCK)  # FMA-folded neighbours, then the fp32 tree
        if SKETCH:
            amax = tl.max(tl.abs(h), axis=0)  # its own tree: ss is the same with and without the sketch
        v = _normalize_store(h, ss, W_ptr, Y_ptr + row * Y_row_stride, cols, mask, n_cols, eps)
        if SKETCH:  # scalars only: h dies here, so the sketch costs no registers across the row
            p_amax, p_ms, p_sq, p_bad = _merge_row(p_amax, p_ms, p_sq, p_bad, ss, amax, v)
    if SKETCH:  # noqa: SIM102 - a constexpr branch: p_bad exists only with the sketch
        if p_bad > 0:  # rare: re-read this program's rows with NaN/±inf (or h*h overflow), exact partials
            for r2 in tl.range(pid, n_rows, tl.num_programs(0)):
                h2 = tl.load(X_ptr + tl.cast(r2, tl.int64) * X_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
                if not (sum_squares(h2, BLOCK) <= FMAX):  # the loop's own test, same sum: same rows
                    a, q, nf = finite_partials(h2, mask)
                    p_amax, p_ms, p_sq, p_nf = _merge_exact(p_amax, p_ms, p_sq, p_nf, a, q, nf, n_cols)
    if SKETCH:
        if pid == tl.num_programs(0) - 1:  # the weight's partials: the last program has the fewest rows
            wv = tl.load(W_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            wmax, _, wnf = finite_partials(wv, mask)
            tl.store(S_ptr + 7, wmax.to(tl.float64))
            tl.atomic_add(I_ptr + 2, wnf.to(tl.int64), sem="relaxed")
        _publish(S_ptr, F_ptr, I_ptr, p_amax, p_sq, p_ms, p_nf, n_rows, n_cols)


# ------------------------------------------------------------------ a program per row, row records


@triton.jit
def _rmsnorm_rows_kernel(
    X_ptr, X_row_stride, W_ptr, Y_ptr, Y_row_stride, S_ptr,  # as _rmsnorm_kernel
    M_ptr,  # row record words, int64 (>= n_rows,), all -1 (sketch_buffer.row_records); unused unless SKETCH
    E_ptr,  # extra records, int64 (>= n_rows, 2)
    n_rows,
    n_cols,
    eps,  # fp32 scalar
    BLOCK: tl.constexpr,
    SKETCH: tl.constexpr,
    STAGES: tl.constexpr,  # 2: the row's loads go through the pipeliner's async copies
    POLL: tl.constexpr,  # record words the finisher reads at once
    EXACT_CHUNK: tl.constexpr,  # width of the pieces the cold paths read (the exact partials, the weight's)
    FINISHER_FIRST: tl.constexpr,  # program 0 finishes (a GPU starts it first); else program n_rows (the interpreter)
    PF_BYTES: tl.constexpr = 0,  # bytes of a row to prefetch into L2 (_common.prefetch_row); 0: none
    pf_ahead=0,  # the row prefetched is pf_ahead rows past this program's
    ALIGN: tl.constexpr = 1,  # n_cols and both row strides are multiples of it (_common.column_multiple)
):
    # A program per row (the same row computation as _rmsnorm_kernel: y is bit-identical). With the
    # sketch each row's program stores its record word (max |h|, its fp32 sum of squares) and one more
    # program is the finisher (_common.poll_records). A row whose
    # partials need more (NaN/±inf, or h*h overflow) writes them to its extra record, then flags its
    # word (_common.release_flag). Started first, it reduces the words as rows
    # complete, in row order, so after the last row only its poll and one reduction are left (started
    # last, it had all its polls left: H200, +17 % over the launch without the sketch).
    pid = tl.program_id(0)
    n_cols, X_row_stride, Y_row_stride = aligned_rows(n_cols, X_row_stride, Y_row_stride, ALIGN)
    first = pid - 1 if SKETCH and FINISHER_FIRST else pid
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if not SKETCH or pid != (0 if FINISHER_FIRST else n_rows):
        for r in tl.range(first, first + 1, num_stages=STAGES):  # one row: a loop for the pipelined loads
            prefetch_row(X_ptr, r, pf_ahead, n_rows, X_row_stride, PF_BYTES)
            row = tl.cast(r, tl.int64)
            x = tl.load(X_ptr + row * X_row_stride + cols, mask=mask, other=0.0, eviction_policy="evict_first")
            h = x.to(tl.float32)
            ss = sum_squares(h, BLOCK)
            if SKETCH:  # before y: the finisher's wait ends with the last row's sums, not with its stores
                amax = tl.max(tl.abs(h), axis=0)
                if ss <= FMAX:  # the rare rest after y (publish_flagged)
                    tl.store(M_ptr + row, record_word(amax, ss))
            # _normalize_store's lines, written out: called here, the sketched launch read 83.2 µs
            # against 73.3 inline on the H200's triton 3.6 (bench/results/norm_chunks_h200_s19d.md;
            # the offline 3.9 SASS of the two was the same), y bit-identical either way
            v = tl.math.div_rn(ss, tl.cast(n_cols, tl.float32))
            rs = tl.math.rsqrt(v + eps)
            w = tl.load(W_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            y = h * rs * w
            tl.store(Y_ptr + row * Y_row_stride + cols, store_cast(y, Y_ptr.dtype.element_ty), mask=mask,
                     eviction_policy="evict_first")
            if SKETCH:  # noqa: SIM102 - a constexpr branch
                if not (ss <= FMAX):  # NaN/±inf (or h*h overflow): exact partials from a re-read, so h dies with y
                    a, q, nf = finite_partials_chunked(X_ptr + row * X_row_stride, tl.arange(0, EXACT_CHUNK), n_cols,
                                                       EXACT_CHUNK)
                    tl.store(E_ptr + row * 2, record_word(a, nf.to(tl.int32)))  # the extra record, then the flag
                    tl.store(E_ptr + row * 2 + 1, q.to(tl.int64, bitcast=True))
                    release_flag(M_ptr + row)
    else:  # the finisher: the weight's partials while rows run, then the record words in row order
        wmax, _, wnf = finite_partials_chunked(W_ptr, tl.arange(0, EXACT_CHUNK), n_cols, EXACT_CHUNK)
        v_amax = tl.zeros([POLL], dtype=tl.float32)  # per word slot across the polls, reduced at the end
        v_sq = tl.zeros([POLL], dtype=tl.float64)
        v_ss = tl.zeros([POLL], dtype=tl.float32)  # largest fp32 sum of a finite row
        g_amax = tl.zeros((), dtype=tl.float32)  # the flagged rows' exact partials
        g_sq = tl.zeros((), dtype=tl.float64)
        g_ms = tl.zeros((), dtype=tl.float64)  # their largest mean square over finite entries
        g_nf = tl.zeros((), dtype=tl.int64)
        for r0 in range(0, n_rows, POLL):
            lo, hi = poll_records(M_ptr, r0, n_rows, POLL)
            flagged = hi == RECORD_FLAG_HI
            ss = tl.where(flagged, 0.0, hi.to(tl.float32, bitcast=True))
            v_amax = tl.maximum(v_amax, tl.where(flagged, 0.0, lo.to(tl.float32, bitcast=True)))
            v_sq += ss.to(tl.float64)
            v_ss = tl.maximum(v_ss, ss)
            rows = r0 + tl.arange(0, POLL)
            r = tl.min(tl.where(flagged, rows, n_rows), axis=0)
            while r < n_rows:  # rare: the flagged rows one by one
                seen = acquire_flag(M_ptr + r)
                a_bits, nf = record_halves(tl.load(E_ptr + r * 2 * seen, volatile=True))
                q = tl.load(E_ptr + r * 2 * seen + 1, volatile=True).to(tl.float64, bitcast=True)
                g_amax, g_ms, g_sq, g_nf = _merge_exact(g_amax, g_ms, g_sq, g_nf, a_bits.to(tl.float32, bitcast=True), q,
                                                        nf.to(tl.float32), n_cols)
                r = tl.min(tl.where(flagged & (rows > r), rows, n_rows), axis=0)
        m_amax, s_sq, m_ss = max_sum_max(v_amax, v_sq, v_ss)
        # the row mean square the op used: div_rn is monotonic, so max(div_rn(ss, n)) = div_rn(max ss, n)
        g_ms = tl.maximum(g_ms, tl.math.div_rn(m_ss, tl.cast(n_cols, tl.float32)).to(tl.float64))
        numel = tl.cast(n_rows, tl.int64) * n_cols
        store_common_features(S_ptr, numel, tl.cast(n_rows, tl.int64), tl.maximum(m_amax, g_amax).to(tl.float64),
                              s_sq + g_sq, numel - g_nf, g_nf + wnf.to(tl.int64))
        tl.store(S_ptr + 5, tl.cast(n_cols, tl.float64))
        tl.store(S_ptr + 6, tl.sqrt(g_ms))
        tl.store(S_ptr + 7, wmax.to(tl.float64))


# ------------------------------------------------------------------ rows longer than MAX_BLOCK


@triton.jit
def _row_sumsq_chunked(X_row, cols, n_cols, CHUNK: tl.constexpr, SKETCH: tl.constexpr, CONST_N: tl.constexpr):
    """(sum of h*h, max |h|) of one row read in CHUNK pieces: a [CHUNK] accumulator per lane summed in
    sequence over the chunks, then one tl.sum tree (the twin's order "blocked", lanes = CHUNK).
    The row stays in L2 (default eviction) for the second pass (evict_last, as Inductor loads its
    first pass, measured no faster: bench/results/norm_chunks_h200_s15c.md); the max is 0.0 without
    the sketch. CONST_N > 0: the row length as a compile-time multiple of CHUNK (no masks, a known
    trip count; the bench's option)."""
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    amx = tl.zeros([CHUNK], dtype=tl.float32)
    for c0 in tl.range(0, CONST_N if CONST_N > 0 else n_cols, CHUNK):
        cm = None if CONST_N > 0 else c0 + cols < n_cols  # no mask with CONST_N
        h = tl.load(X_row + c0 + cols, mask=cm, other=None if CONST_N > 0 else 0.0).to(tl.float32)
        acc += h * h  # rounded product, then the lane's add (no FMA contraction)
        if SKETCH:
            amx = tl.maximum(amx, tl.abs(h))
    if SKETCH:
        return sum_and_max(acc, amx)
    else:
        return tl.sum(acc, axis=0), 0.0


@triton.jit
def _rmsnorm_chunked_kernel(
    X_ptr, X_row_stride, W_ptr, Y_ptr, Y_row_stride, S_ptr, F_ptr, I_ptr,  # as _rmsnorm_kernel
    n_rows,
    n_cols,
    eps,  # fp32 scalar
    CHUNK: tl.constexpr,  # elements per load; rows are read in ceil(n / CHUNK) pieces, twice
    SKETCH: tl.constexpr,
    CONST_N: tl.constexpr,  # 0, or n_cols as a compile-time multiple of CHUNK (_row_sumsq_chunked)
    ALIGN: tl.constexpr = 1,  # n_cols and the row strides are multiples of it (_common.column_multiple)
):
    # Two passes per row: sum of squares (DRAM), then normalize and store (an L2 re-read). Slower
    # than a row held in registers where one fits (bench/norm_chunks.py), so only rows past MAX_BLOCK.
    pid = tl.program_id(0)
    n_cols, X_row_stride, Y_row_stride = aligned_rows(n_cols, X_row_stride, Y_row_stride, ALIGN)
    cols = tl.arange(0, CHUNK)
    if SKETCH:
        p_amax = tl.zeros((), dtype=tl.float32)
        p_ms = tl.zeros((), dtype=tl.float64)
        p_sq = tl.zeros((), dtype=tl.float64)
        p_nf = tl.zeros((), dtype=tl.int64)
        p_bad = tl.zeros((), dtype=tl.int32)
    for r in tl.range(pid, n_rows, tl.num_programs(0)):
        row = tl.cast(r, tl.int64)
        ss, amax = _row_sumsq_chunked(X_ptr + row * X_row_stride, cols, n_cols, CHUNK, SKETCH, CONST_N)
        v = tl.math.div_rn(ss, tl.cast(n_cols, tl.float32))
        rs = tl.math.rsqrt(v + eps)
        for c0 in tl.range(0, CONST_N if CONST_N > 0 else n_cols, CHUNK):
            cm = None if CONST_N > 0 else c0 + cols < n_cols  # no mask with CONST_N
            h = tl.load(X_ptr + row * X_row_stride + c0 + cols, mask=cm, other=None if CONST_N > 0 else 0.0,
                        eviction_policy="evict_first").to(tl.float32)
            w = tl.load(W_ptr + c0 + cols, mask=cm, other=None if CONST_N > 0 else 0.0,
                        eviction_policy="evict_last").to(tl.float32)
            tl.store(Y_ptr + row * Y_row_stride + c0 + cols, store_cast(h * rs * w, Y_ptr.dtype.element_ty), mask=cm,
                     eviction_policy="evict_first")
        if SKETCH:
            p_amax, p_ms, p_sq, p_bad = _merge_row(p_amax, p_ms, p_sq, p_bad, ss, amax, v)
    if SKETCH:
        if p_bad > 0:  # rare: exact partials of this program's rows with NaN/±inf (or overflow)
            for r2 in tl.range(pid, n_rows, tl.num_programs(0)):
                x_row = X_ptr + tl.cast(r2, tl.int64) * X_row_stride
                ss2, _ = _row_sumsq_chunked(x_row, cols, n_cols, CHUNK, False, CONST_N)
                if not (ss2 <= FMAX):  # the loop's own test, same order: same rows
                    a, q, nf = finite_partials_chunked(x_row, cols, n_cols, CHUNK)
                    p_amax, p_ms, p_sq, p_nf = _merge_exact(p_amax, p_ms, p_sq, p_nf, a, q, nf, n_cols)
        if pid == tl.num_programs(0) - 1:  # the weight's partials (CHUNK pieces): the last program has the fewest rows
            wmax, _, wnf = finite_partials_chunked(W_ptr, cols, n_cols, CHUNK)
            tl.store(S_ptr + 7, wmax.to(tl.float64))
            tl.atomic_add(I_ptr + 2, wnf.to(tl.int64), sem="relaxed")
        _publish(S_ptr, F_ptr, I_ptr, p_amax, p_sq, p_ms, p_nf, n_rows, n_cols)


def _rmsnorm_launch(
    x2: torch.Tensor, weight: torch.Tensor, y2: torch.Tensor, buf: torch.Tensor | None, eps: float,
    num_warps: int | None = None, stages: int | None = None, per_sm: int | None = None,
    chunk: int | None = None, maxnreg: int | None = None, const_n: bool = False, row_grid: bool | None = None,
    poll: int | None = None, prefetch: float | None = None,
) -> None:
    """Grid: one persistent program per resident slot (persistent_grid), each over its share of rows;
    one program per row where _common.ROW_GRID lists the launch (with the sketch: row records and a
    finisher program, _rmsnorm_rows_kernel). row_grid overrides ROW_GRID (tests, the bench), poll the
    record words the finisher reads at once (a power of two; _common.RECORD_POLL), prefetch the L2
    prefetch of the launch with a program per row, in waves of programs ahead (_common.PREFETCH).
    Rows longer than MAX_BLOCK (or than `chunk`, the bench's comparison) go to the two-pass chunked
    kernel, TRITON_CHUNK wide by default (part of the numerics: the twin's lanes).
    num_warps / stages / per_sm / chunk / maxnreg (registers per thread) / const_n (the chunked kernel
    compiled for this row length) override the tuned launch (the bench's sweep; num_warps changes the
    tl.sum tree). The launch is worked out once per key (launch_plan)."""
    n_rows, n = x2.shape
    sketch = buf is not None
    if n_rows == 0 and not sketch:
        return
    xs, ys = x2.stride(0), y2.stride(0)
    key = ("rmsnorm", x2.shape, xs, ys, x2.data_ptr() & 15, x2.dtype, weight.dtype, y2.dtype, x2.device, sketch,
           num_warps, stages, per_sm, chunk, maxnreg, const_n, row_grid, poll, prefetch)
    p = kept(key) or _rmsnorm_plan(x2, y2, sketch, num_warps, stages, per_sm, chunk, maxnreg, const_n, row_grid,
                                   poll, prefetch)
    if not sketch:
        a, b = y2, y2
    elif p.kernel is _rmsnorm_rows_kernel:
        a, b = row_records("rmsnorm", x2.device, n_rows)
    else:
        a, b = workspace("rmsnorm", x2.device)
    run(key, p, (x2, xs, weight, y2, ys, buf if sketch else y2, a, b, n_rows, n, eps))


def _rmsnorm_plan(x2: torch.Tensor, y2: torch.Tensor, sketch: bool, num_warps: int | None, stages: int | None,
                  per_sm: int | None, chunk: int | None, maxnreg: int | None, const_n: bool, row_grid: bool | None,
                  poll: int | None, prefetch: float | None) -> Plan:
    """_rmsnorm_launch's kernel, grid and options for this call's shape, strides, dtype and overrides."""
    n_rows, n = x2.shape
    if n > MAX_BLOCK or (chunk is not None and n > chunk):
        block, warps, _, _ = launch_config("rmsnorm-chunked", n, num_warps, 1, chunk=chunk or TRITON_CHUNK)
        align = column_multiple(n, x2.stride(0), y2.stride(0))
        key = ("rmsnorm-chunked", x2.dtype, block, warps, sketch, const_n, align)
        return plan(_rmsnorm_chunked_kernel, (persistent_grid(key, n_rows, x2.device, per_sm),),
                    {"CHUNK": block, "SKETCH": sketch, "CONST_N": n if const_n and n % block == 0 else 0,
                     "ALIGN": align, "num_warps": warps, "enable_fp_fusion": False}, key, warps)
    block, warps, st, cap = launch_config("rmsnorm", n, num_warps, stages, maxnreg=maxnreg, esize=x2.element_size())
    regs = register_cap(cap)  # registers per thread
    align = column_multiple(n, x2.stride(0), y2.stride(0))
    if per_sm is None and (("rmsnorm", block) in ROW_GRID if row_grid is None else row_grid):
        st = RECORD_STAGES.get(("rmsnorm", block), st) if sketch and stages is None else st
        key = ("rmsnorm-rows", x2.dtype, block, warps, st, cap, sketch, align)
        pf = prefetch_args("rmsnorm", block, x2, sketch, n_rows + sketch, key, prefetch)
        return plan(_rmsnorm_rows_kernel, (n_rows + sketch,),
                    {"BLOCK": block, "SKETCH": sketch, "STAGES": st, "POLL": poll or RECORD_POLL,
                     "EXACT_CHUNK": min(block, EXACT_CHUNK), "FINISHER_FIRST": not INTERPRETED, **pf, "ALIGN": align,
                     "num_warps": warps, "enable_fp_fusion": False, **regs}, key, warps)
    key = ("rmsnorm", x2.dtype, block, warps, st, cap, sketch, align)
    grid = persistent_grid(key, n_rows, x2.device, grid_per_sm("rmsnorm", block, sketch, per_sm))
    return plan(_rmsnorm_kernel, (grid,),
                {"BLOCK": block, "SKETCH": sketch, "STAGES": st, "ALIGN": align, "num_warps": warps,
                 "enable_fp_fusion": False, **regs}, key, warps)


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = EPS, sketch: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y, sketch features or None): y = x * rsqrt(mean(x^2) + eps) * weight, in x's dtype.

    Read the features with optwin.kernels.read_sketch("rmsnorm", buf).
    """
    check_device(x, weight)
    check_rows("rmsnorm", x, weight=weight)
    x2 = rows_view(x)  # (rows, hidden)
    y2 = torch.empty(x2.shape, dtype=x.dtype, device=x.device)  # (rows, hidden)
    buf = new_buffer("rmsnorm", x.device) if sketch else None
    _rmsnorm_launch(x2, weight.contiguous(), y2, buf, float(eps))
    return y2.reshape(x.shape), buf
