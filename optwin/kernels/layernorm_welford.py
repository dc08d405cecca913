"""LayerNorm as torch.compile runs it, in Triton, with the input sketch in the same launch: Welford over
pieces, a program per row (layernorm/triton for the rows twin.numerics.welford_chunk takes; the others:
optwin.kernels.layernorm).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.layernorm import layernorm; \
print(layernorm(torch.randn(2, 5120), torch.ones(5120), torch.zeros(5120))[0].shape)"

Rows of 4096..65536 that a chunk c of 4096, 2048 or 1024 divides into at least 3 pieces
(twin.numerics.welford_chunk: the largest such c) take this kernel, a program per row as torch.compile
runs layernorm (_layernorm_welford_kernel):
    lane l (of c) runs Welford over h[l], h[l + c], ...:
        first piece mean = h, M2 = 0; then per piece k: r = div_rn(1, k) (one scalar per piece);
        delta = h - mean; mean = fma(delta, r, mean); M2 = fma(delta, h - mean, M2)
    a tree of Chan merges over the lanes (frac = div_rn(wb, wa + wb); mean = ma + delta*frac;
    M2 = (qa + qb) + ((delta*delta)*wa)*frac, each op rounded), var = div_rn(M2, n)
    y = fma((h - m) * rsqrt(var + eps), w, b), a second pass over the row (an L2 hit)
(twin.layernorm.welford(..., lanes=c); the GPU's tree order is tl.reduce's, the
interpreter runs the twin's halving tree). H200 bf16, µs L2 flushed, against torch.compile: 4096x16384
71.2 (72.4), 8192x8192 70.2 (77.7), 16384x4096 69.4 (96.0), 8192x5120 48.1 (77.8), 2048x32768 78.3
(107.8); the row-in-registers kernel 76.4, 93.1, 77.9, 78.4, 94.9 (bench/results/layernorm_welford_h200_s20g.md).
With the sketch at 4096x16384: 76.5 / 73.4 flushed / graph, against the row-in-registers launch's 79.4 /
75.5; the sketch costs +7.5 to +34 % of this kernel over those widths (RESULTS.md, stop 20).
Compiled without FMA contraction: the FMAs are written out, and the twin models each rounding.
The sketch (y is bit-identical with and without it: the merge tree carries max |x| beside mean, M2 and
count, and the same merges): each row's program stores two record words, (mean, var) and (max |x|, sum
of squares) (sketch_buffer.row_records); one more program, the finisher, polls them (_common.poll_records),
derives each row's std and |mean|/std as the persistent kernel's slots do, and reduces them. A row with
NaN/±inf, overflowing squares, or that could be constant merges its exact float64 partials into the
"layernorm" workspace with scalar atomics and flags its second word (released after them); the finisher
acquires each flag and, if any row was flagged, adds the workspace to its own partials and resets it.
Where the sketch's cost is (stop 28, H200 bf16, µs without the sketch / with / with the records and
the finisher's polls left out, PROBE=2): 4096x16384 71.0 / 76.8 / 75.2, 16384x4096 69.3 / 76.6 / 72.1,
8192x5120 47.4 / 51.3 / 45.9 (bench/results/layernorm_tail_h200_s28_*.md). The finisher reads every
row's record in one program: at 16384 rows it was the kernel's tail while it took a sqrt and a division
a row itself (stop 27's layout: 77.6 / 53.6 µs at 16384x4096 / 8192x5120 in the same rounds). Not
occupancy: 2, 3 or 4 programs per SM (54, 40, 32 registers) gave 77.7, 77.0 and 89.9 µs at 4096x16384
(the cap of 32 spills nothing in the rows' loop, but schedules it worse; layernorm_welford_ab_h200_s28_*.md),
and folding the finisher's per-thread rows (80 -> 63 registers at 4 warps) moved nothing
(layernorm_lanes_h200_s28_*.md); without the records 32 registers (4 programs per SM) ran 75.1 against
72.9 µs for 40 (3), stop 36 (layernorm_occupancy_h200_s36.md). The rows per poll matter: 512 is the
fastest of 128..2048 at every shape timed (layernorm_probe_h200_s28_*.md). Stop 36: the rows' two record
stores (with the sqrt and division before them) cost 1.3 µs at 4096x16384, 1.1 at 16384x4096 (a probe
with the stores and no polls, layernorm_polls_*_h200_s36.md). Stop 37: the finisher derives std and
|mean|/std again (the rows had since stop 28), in four A/Bs 0.5 µs faster: 75.0 -> 74.7 and 75.3 -> 74.8 at
4096x16384, 75.9 -> 75.3 at 8192x8192, 76.3 -> 75.8 at 16384x4096 (layernorm_records_*_h200_s3[67].md).
Stop 40's persistent form of the sketch (each program over many rows, the running max reduced once, no
records and no finisher; 64-93 registers) lost everywhere on the H200 (stop 41, bf16 flushed, sketch cost
against this launch's): 4096x16384 +64 % (+2.8 %), 8192x8192 +45 % (+4.8 %), 16384x4096 +25 % (+8.4 %),
2048x32768 +119 % (+34.5 %) (bench/results/ln_persist_*_h200_s41.md), and was removed.
Deferred (defer=True; patch(model) defers): the launch's extra program takes only the parameters' partials (their
features into the call's buffer, their NaN/±inf count into its workspace) and a page of calls' records is reduced
later by one batched launch (optwin.kernels.deferred, _finish_deferred_kernel: the in-launch finisher's code,
_finish_records). Stop 38's form (row 0's program took the parameters: the rows' kernel grew 2312 -> 2592 SASS)
lost and was reverted; this one's rows kernel is the in-launch one's without the polls (1888 SASS, 40 registers).
H200 bf16, 64 calls queued behind a GPU sleep, µs a call, no sketch / finisher in the launch / deferred
(bench/results/ln_deferred_*_h200_s42b.md): 4096x16384 69.3 / 72.0 / 71.7, 8192x8192 68.1 / 71.7 / 69.5,
16384x4096 67.5 / 73.5 / 71.6, 2048x32768 75.2 / 94.3 / 92.7; fp16 4096x16384 68.7 / 71.8 / 70.7. Back to back,
host in the loop, in windows of 100 calls (a settle mid-window): 4096x16384 69.8 / 72.9 / 72.7, 8192x8192 68.8 /
72.8 / 70.6; in windows of exactly a page the settle opens each window with the GPU idle and deferral reads 76.2
at 4096x16384 (ln_deferred_calls*_h200_s42.md). Host 24.8 µs a call deferred against 17.6 without the sketch
(traced: ln_deferred_trace_h200_s42.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.errors import InputError
from optwin.kernels import _common, deferred
from optwin.kernels._common import (
    FMAX,
    INTERPRET,
    INTERPRETED,
    MAX_BLOCK,
    RECORD_FLAG_HI,
    RECORD_POLL,
    WS_SLOTS,
    acquire_flagged,
    globaltimer,
    max_sum_max_min,
    poll_records,
    prefetch_args,
    prefetch_row,
    read_slot,
    record_word,
    register_cap,
    release_flag,
    reset_workspace,
    store_cast,
    store_common_features,
)
from optwin.kernels.fast_launch import launch
from optwin.kernels.launch_plan import Plan, kept, plan, run
from optwin.kernels.layernorm_sketch import (
    _chunked_exact_row,
    _could_be_constant,
    _merge_partials,
    _param_features,
    _param_partials,
    _ratio,
    _store_own_features,
)
from optwin.kernels.packed16 import abs_max_pairs
from optwin.kernels.sketch_buffer import RATIO_CAP, new_buffer, row_records, workspace
from optwin.twin.numerics import welford_chunk as _welford_rule

# The Welford launch: twin.numerics.welford_chunk's chunk (numerics), 8 elements (one 16-byte bf16
# vector) a thread a piece: num_warps = chunk / 256. H200 bf16, µs L2 flushed, chunk/warps (torch.compile;
# the row in registers): 4096x16384 4096/16 70.8, /8 78.7 (72.8; 76.5); 8192x8192 2048/8 70.3, 4096/8
# 69.9, 4096/16 89.6 (77.4; 92.7); 16384x4096 1024/4 69.7, 2048/8 80.7 (96.4; 77.8); 8192x6144 2048/8
# 54.2 (65.6); 8192x5120 1024/4 47.6 (78.0); 2048x32768 4096/16 77.9 (107.7; 94.9)
# (bench/results/layernorm_welford_h200_s20*.md). The chunk must divide the row: a ragged last piece
# (12000 at 4096) ran no faster than the row in registers, and +13 % against +7 % with the sketch.
ELEMS_PER_THREAD = 8
# Registers a thread of the sketched Welford launch, per num_warps (elsewhere the compiler's). At 16 warps
# (chunk 4096) triton 3.6 gives it 40 up to rows of 24576 and 52 from 32768 (offline sm_90a): 2 programs
# per SM instead of the plain launch's 3. Capped at 40 (8 bytes spilled outside the row loop) the
# sketched 2048x32768 ran 93.8 against 105.1 µs, the plain launch 78.3 (H200 bf16 flushed,
# bench/results/ln_caps_2048x32768_h200_s41.md; again 93.7 / 105.4, ln_pf_2048x32768_h200_s41.md).
# Not at rows of 65536: the cap spills inside the row loop there, 112.3 against 111.8 µs
# (ln_pf_1024x65536_h200_s41.md). Nor at 4 or 8 warps: 48 at 16384x4096 ran 82.0 against 75.8, 40 at
# 8192x8192 73.8 against 73.6 (ln_caps_*_h200_s41.md). A cap of 32 at 4096x16384 (the plain kernel's)
# spills only in the cold paths but ran 89.9 against 77.0 µs (stop 28).
WELFORD_REG_CAP: dict[int, int] = {16: 40}
WELFORD_REG_CAP_BELOW = 65536  # rows at least this long keep the compiler's count


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
    """Running max |x| per lane. PACKED (16-bit x): packed16.abs_max_pairs, one instruction for two
    elements, in x's dtype (exact; the sign is garbage, take |acc| at the end; a NaN loses to a number,
    but such a row is flagged and recomputed); else fp32 max(acc, |h|), one instruction an element."""
    if PACKED:
        return abs_max_pairs(acc, xr)
    else:
        return tl.maximum(acc, tl.abs(h))


@triton.jit
def _welford_merge_max(ma, qa, wa, xa, mb, qb, wb, xb):
    """_welford_merge with a running max riding along (the sketch's max |h|): the same merges, so the
    same mean and M2 as without it."""
    m, q, w = _welford_merge(ma, qa, wa, mb, qb, wb)
    return m, q, w, tl.maximum(xa, xb)


@triton.jit
def _welford_row(X_row, N: tl.constexpr, CHUNK: tl.constexpr, MAX: tl.constexpr, PACKED: tl.constexpr):
    """One row's (mean, var, max |x|): lane l runs Welford's update over elements l, l + CHUNK, ... (the
    first piece sets mean = h, M2 = 0; every lane has the same count, so 1/count is one division per
    piece), then a tree of Chan merges. MAX: the lanes' running max |x| (_abs_max_step) rides in the
    merge tree (else the max is 0)."""
    cols = tl.arange(0, CHUNK)
    FULL: tl.constexpr = (N // CHUNK) * CHUNK  # columns in whole pieces (N >= CHUNK)
    xr = tl.load(X_row + cols, eviction_policy="evict_last")
    mean = xr.to(tl.float32)  # count 1: mean = h, M2 = 0
    m2 = tl.zeros([CHUNK], dtype=tl.float32)
    amax = _abs_max_start(xr, mean, PACKED)  # dead code without MAX
    k = 1.0
    for c0 in tl.range(CHUNK, FULL, CHUNK):
        xr = tl.load(X_row + c0 + cols, eviction_policy="evict_last")
        h = xr.to(tl.float32)
        k += 1.0
        rc = tl.math.div_rn(1.0, k)  # one scalar per piece
        delta = h - mean
        mean = tl.fma(delta, rc, mean)
        m2 = tl.fma(delta, h - mean, m2)
        if MAX:
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
        if MAX:
            amax = _abs_max_step(amax, xr, h, PACKED)  # padding is 0
    if INTERPRET:  # the twin's tree (the interpreter's tl.reduce folds left); the max its own tree
        m, q = _welford_tree(mean, m2, cnt, CHUNK)
        hmax = tl.max(tl.abs(amax.to(tl.float32)), 0)
    elif MAX:
        m, q, _, hmax = tl.reduce((mean, m2, cnt, tl.abs(amax.to(tl.float32))), 0, _welford_merge_max)
    else:
        m, q, _ = tl.reduce((mean, m2, cnt), 0, _welford_merge)
        hmax = tl.zeros((), dtype=tl.float32)
    return m, tl.math.div_rn(q, tl.cast(N, tl.float32)), hmax


@triton.jit
def _welford_normalize(X_row, W_ptr, B_ptr, Y_row, m, var, eps, N: tl.constexpr, CHUNK: tl.constexpr):
    """y = fma((h - m) * rsqrt(var + eps), w, b) over the row, a second pass (an L2 hit)."""
    cols = tl.arange(0, CHUNK)
    rs = tl.math.rsqrt(var + eps)  # approximate rsqrt
    for c0 in tl.range(0, N, CHUNK):
        cm = c0 + cols < N
        h = tl.load(X_row + c0 + cols, mask=cm, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(W_ptr + c0 + cols, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
        b = tl.load(B_ptr + c0 + cols, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
        tl.store(Y_row + c0 + cols, store_cast(tl.fma((h - m) * rs, w, b), Y_row.dtype.element_ty), mask=cm,
                 eviction_policy="evict_first")


@triton.jit
def _layernorm_welford_kernel(
    X_ptr, X_row_stride, W_ptr, B_ptr, Y_ptr, Y_row_stride, S_ptr,  # as _layernorm_kernel
    M_ptr,  # row record words, int64 (>= 2 * n_rows,), all -1 (sketch_buffer.row_records); unused unless SKETCH
    T_ptr,  # PROBE 131072 (bench only): int64 globaltimer stamps, the rows' starts and ends, then the finisher's
    F_ptr,  # the "layernorm" workspace's float64 slots (sketch_buffer.workspace): the flagged rows' partials
    I_ptr,  # its int64 slots
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
    PF_BYTES: tl.constexpr = 0,  # bytes of a row to prefetch into L2 (_common.prefetch_row); 0: none
    pf_ahead=0,  # the row prefetched is pf_ahead rows past this program's
    PROBE: tl.constexpr = 0,  # bench only (the sketch is then wrong), bits: 1 no max |h|, 2 no records (no polls), 4 no flagged path,
    # 131072 globaltimer stamps into T_ptr (the sketch stays right; bench/finisher_timeline.py)
    DEFER: tl.constexpr = False,  # the records finished later (optwin.kernels.deferred): the extra program takes
    # only the parameters' partials (their features into S, their NaN/±inf count into the workspace)
):
    # A program per row, as torch.compile's layernorm: lane l runs Welford's update over elements l,
    # l + CHUNK, ... (the first piece sets mean = h, M2 = 0; every lane has the same count, so 1/count is
    # one division per piece), a tree of Chan merges gives the row's mean and M2, and a second pass
    # re-reads the row (an L2 hit) for y. Few registers a thread (no row held), so many programs per SM.
    # With the sketch each row's program stores two record words, (mean, var) and (max |h|, sum of
    # squares), and one more program, the finisher, polls and reduces them (_common.poll_records). A row
    # with NaN/±inf (or overflowing squares), or one that could be constant, merges exact partials into the
    # workspace and flags its second word.
    pid = tl.program_id(0)
    if not SKETCH or pid != (0 if FINISHER_FIRST else n_rows):
        row = tl.cast(pid - 1 if SKETCH and FINISHER_FIRST else pid, tl.int64)
        if PROBE // 131072 % 2 == 1:
            tl.store(T_ptr + row, globaltimer(row))
        prefetch_row(X_ptr, row, pf_ahead, n_rows, X_row_stride, PF_BYTES)
        X_row = X_ptr + row * X_row_stride
        m, var, hmax = _welford_row(X_row, N, CHUNK, SKETCH and PROBE % 2 == 0, PACKED)
        if SKETCH:  # before y: the finisher's wait ends with the last row's sums, not with its stores
            sq = (var + m * m) * N  # the row's sum of squares, as _slot_partials derives it
            plain = (sq <= FMAX) & ~_could_be_constant(m, var)
            if plain and PROBE // 2 % 2 == 0:  # the rare rest after y
                # (mean, var) as they are: the finisher derives std and |mean|/std (stop 37: 0.5 µs less
                # than the rows deriving them, in four A/Bs at 4096x16384, 8192x8192 and 16384x4096)
                tl.store(M_ptr + row * 2, record_word(m, var))
                tl.store(M_ptr + row * 2 + 1, record_word(hmax, sq))
        _welford_normalize(X_row, W_ptr, B_ptr, Y_ptr + row * Y_row_stride, m, var, eps, N, CHUNK)
        if SKETCH and PROBE % 8 < 4:  # noqa: SIM102 - a constexpr branch
            if not plain:
                _publish_flagged_row(X_row, M_ptr + row * 2 + 1, F_ptr, I_ptr, N, EXACT_CHUNK, CAP)
        if PROBE // 131072 % 2 == 1:
            tl.store(T_ptr + n_rows + row, globaltimer(row))
    elif DEFER:  # the parameters' partials; the deferred finisher reads their count from the workspace
        _param_partials(W_ptr, B_ptr, S_ptr, I_ptr, tl.arange(0, EXACT_CHUNK), N, EXACT_CHUNK)
    else:  # the finisher: the parameters' partials while rows run, then the records in row order
        param_nf = _param_features(W_ptr, B_ptr, S_ptr, tl.arange(0, EXACT_CHUNK), N, EXACT_CHUNK)
        _finish_records(S_ptr, F_ptr, I_ptr, M_ptr, n_rows, N, param_nf, n_rows if PROBE // 2 % 2 == 0 else 0, POLL,
                        CAP, T_ptr, PROBE // 131072 % 2 == 1, False)


@triton.jit
def _finish_records(S_ptr, F_ptr, I_ptr, M_ptr, n_rows, n_cols, param_nf, n_polled, POLL: tl.constexpr,
                    CAP: tl.constexpr, T_ptr, STAMPS: tl.constexpr, RESET: tl.constexpr):
    """The finisher's reduction: the first n_polled rows' record words polled in row order (POLL at once), each
    row's std and |mean|/std derived from (mean, var), the flagged rows' workspace added, the features stored
    (param_nf: the parameters' NaN/±inf count). RESET: the workspace goes back to its identities even without
    a flagged row (the deferred finisher: the parameters' count is in it). STAMPS (bench only): each poll's
    arrival and the end as globaltimer stamps into T_ptr (bench/finisher_timeline.py)."""
    v_amax = tl.zeros([POLL], dtype=tl.float32)  # per row slot across the polls, reduced at the end
    v_sq = tl.zeros([POLL], dtype=tl.float64)
    v_ratio = tl.zeros([POLL], dtype=tl.float32)
    v_minstd = tl.full([POLL], float("inf"), tl.float32)
    first_flagged = n_rows
    for r0 in range(0, n_polled, POLL):
        lo, hi = poll_records(M_ptr, r0, n_rows, POLL, 2)
        if STAMPS:  # when this poll's records were all in
            tl.store(T_ptr + 2 * n_rows + r0 // POLL, globaltimer(r0))
        mean_bits, amax_bits = tl.split(lo)  # word 0 = (mean, var), word 1 = (max |h|, sum h*h or the flag)
        var_bits, tag = tl.split(hi)
        sf = tl.sqrt(var_bits.to(tl.float32, bitcast=True))
        ratio = _ratio(mean_bits.to(tl.float32, bitcast=True), sf, -1.0, CAP)
        rows = r0 + tl.arange(0, POLL)
        flagged = tag == RECORD_FLAG_HI
        plain = (rows < n_rows) & ~flagged
        v_amax = tl.maximum(v_amax, tl.where(plain, amax_bits.to(tl.float32, bitcast=True), 0.0))
        v_sq += tl.where(plain, tag.to(tl.float32, bitcast=True), 0.0).to(tl.float64)
        v_ratio = tl.maximum(v_ratio, tl.where(plain, ratio, 0.0))
        v_minstd = tl.minimum(v_minstd, tl.where(plain, sf, float("inf")))
        first_flagged = tl.minimum(first_flagged, acquire_flagged(M_ptr, flagged, rows, n_rows, 2))
    m_amax, s_sq, m_ratio, m_minstd = max_sum_max_min(v_amax, v_sq, v_ratio, v_minstd)
    g_amax, g_sq, g_ratio, g_minstd = m_amax.to(tl.float64), s_sq, m_ratio.to(tl.float64), m_minstd.to(tl.float64)
    g_const = tl.zeros((), dtype=tl.float64)
    g_nf = tl.zeros((), dtype=tl.int64)
    if first_flagged < n_rows:  # the flagged rows' partials; untouched, the workspace is still at its identities
        g_amax = tl.maximum(g_amax, read_slot(F_ptr + 0))
        g_sq += read_slot(F_ptr + 1)
        g_ratio = tl.maximum(g_ratio, read_slot(F_ptr + 2))
        g_minstd = tl.minimum(g_minstd, read_slot(F_ptr + 3))
        g_const = read_slot(F_ptr + 4)
        g_nf = read_slot(I_ptr + 1)
        reset_workspace(F_ptr, I_ptr)
    elif RESET:
        reset_workspace(F_ptr, I_ptr)
    numel = tl.cast(n_rows, tl.int64) * n_cols
    store_common_features(S_ptr, numel, tl.cast(n_rows, tl.int64), g_amax, g_sq, numel - g_nf, g_nf + param_nf)
    tl.store(S_ptr + 5, tl.cast(n_cols, tl.float64))
    _store_own_features(S_ptr, g_ratio, g_minstd, g_const, n_rows, CAP)
    if STAMPS:
        tl.store(T_ptr + 2 * n_rows + tl.cdiv(n_rows, POLL), globaltimer(n_rows))


@triton.jit
def _finish_deferred_kernel(S_ptr, F_ptr, I_ptr, M_ptr, D_ptr, FEATURES: tl.constexpr, POLL: tl.constexpr,
                            CAP: tl.constexpr):
    """Deferred finishing (optwin.kernels.deferred): program k finishes a page's call k, the records its rows
    stored at word D[k, 0], its D[k, 1] rows of D[k, 2] columns, its workspace row (the flagged rows' partials
    and the parameters' NaN/±inf count) and its row of the batch's features (the launch's extra program wrote
    the parameters' own)."""
    k = tl.program_id(0)
    off = tl.load(D_ptr + 3 * k)
    n_rows = tl.load(D_ptr + 3 * k + 1).to(tl.int32)
    n_cols = tl.load(D_ptr + 3 * k + 2)
    F_k = F_ptr + k * 2 * WS_SLOTS
    I_k = I_ptr + k * WS_SLOTS
    param_nf = read_slot(I_k + 2)
    _finish_records(S_ptr + k * FEATURES, F_k, I_k, M_ptr + off, n_rows, n_cols, param_nf, n_rows, POLL, CAP, M_ptr,
                    False, True)


def finish_deferred(page: deferred.Page, features: torch.Tensor, desc: torch.Tensor, calls: int) -> None:
    """optwin.kernels.deferred's finisher for layernorm: a program per settling call."""
    launch(_finish_deferred_kernel, (calls,), features, page.ws_f, page.ws_i, page.records, desc,
           FEATURES=features.shape[1], POLL=RECORD_POLL, CAP=RATIO_CAP, num_warps=8)


deferred.register_finisher("layernorm", finish_deferred)


@triton.jit
def _publish_flagged_row(X_row, flag_ptr, F_ptr, I_ptr, n_cols, CHUNK: tl.constexpr, CAP: tl.constexpr):
    """A row the finisher cannot derive from (mean, var) (NaN/±inf, overflowing squares, or one that
    could be constant): its exact finite-only partials (_chunked_exact_row, float64 sums) merged into
    the workspace with scalar atomics, then the flag on its second record word, released after them
    (the first gets a non-sentinel word: the finisher waits for both, then acquires the flag).
    The merge is here, not in the finisher, which would hold its partials in registers across every poll."""
    amax, sq, nf, mf, sf, c = _chunked_exact_row(X_row, tl.arange(0, CHUNK), n_cols, CHUNK)
    _merge_partials(F_ptr, I_ptr, amax, sq, _ratio(mf, sf, c, CAP), sf, nf.to(tl.int64), c)
    tl.store(flag_ptr - 1, record_word(tl.zeros((), tl.float32), tl.zeros((), tl.float32)))
    release_flag(flag_ptr)


def _welford_launch(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y2: torch.Tensor,
                    buf: torch.Tensor | None, eps: float, num_warps: int | None = None, poll: int | None = None,
                    maxnreg: int | None = None, probe: int = 0, welford_chunk: int | None = None,
                    prefetch: float | None = None, packed: bool | None = None,
                    timestamps: torch.Tensor | None = None, defer: bool = False) -> torch.Tensor | None:
    """_layernorm_welford_kernel: a program per row (and the finisher with the sketch), the row length
    compiled in (one kernel per hidden size, as torch.compile specializes). poll: rows whose records
    the finisher reads at once (a power of two; tests put flagged rows across its boundaries); prefetch:
    waves of programs ahead whose rows go to the L2 first (_common.prefetch_depth); packed: max |x| on 16-bit
    element pairs (default for 16-bit x) or on the float32 values; timestamps: int64 (2 * n_rows + polls + 1,)
    for PROBE 131072's globaltimer stamps (bench/finisher_timeline.py); maxnreg: registers a thread (0:
    the compiler's) instead of WELFORD_REG_CAP's; defer (with buf None): the sketch wanted, its records
    finished later, batched with other calls' (optwin.kernels.deferred; not inside CUDA graph capture, nor
    past deferred.MAX_ROWS rows). The launch is worked out once per key (launch_plan).
    Returns the buffer the sketch goes to: buf, with defer a pending page buffer or a new one, or None."""
    if defer and buf is not None:
        raise InputError("layernorm: defer makes its own sketch buffer; pass buf=None")
    n_rows = x2.shape[0]
    sketch = buf is not None or defer
    xs, ys = x2.stride(0), y2.stride(0)
    key = ("layernorm-welford", x2.shape, xs, ys, x2.data_ptr() & 15, x2.dtype, weight.dtype,
           bias.dtype, y2.dtype, x2.device, sketch, num_warps, poll, maxnreg, probe, welford_chunk, prefetch, packed,
           timestamps is None)
    p = kept(key) or _welford_plan(x2, sketch, num_warps, poll, maxnreg, probe, welford_chunk, prefetch, packed)
    defer = defer and timestamps is None and deferred.takes(n_rows, x2.device)
    with deferred.launch_lock(defer):  # held from the reservation until the launch is queued
        if defer:
            buf, m, f, i = deferred.reserve("layernorm", x2.device, n_rows, x2.shape[1], words=2)
        else:
            buf = new_buffer("layernorm", x2.device) if sketch and buf is None else buf
            m = row_records("layernorm", x2.device, n_rows, words=2, extra=0)[0] if sketch else y2
            f, i = workspace("layernorm", x2.device) if sketch else (y2, y2)
        args = (x2, xs, weight, bias, y2, ys, buf if sketch else y2, m, m if timestamps is None else timestamps, f, i,
                n_rows, eps)
        if defer:  # launched as its own fast_launch key; kept as the plan that holds it
            run((*key, "deferred"), p.extra[0], args, kept_as=(key, p))
        else:
            run(key, p, args)
    return buf


def _welford_plan(x2: torch.Tensor, sketch: bool, num_warps: int | None, poll: int | None, maxnreg: int | None,
                  probe: int, welford_chunk: int | None, prefetch: float | None, packed: bool | None) -> Plan:
    """_welford_launch's grid and options for this call's shape, dtype and overrides."""
    n_rows, n = x2.shape
    # another chunk (or a ragged one) is not the catalog variant's numerics: the bench's sweep and tests
    chunk = welford_chunk or _welford_rule(n) or 4096
    if n < chunk or n > MAX_BLOCK:
        raise InputError(f"layernorm: the Welford launch takes rows of {chunk}..{MAX_BLOCK}, got {n}")
    warps = num_warps or max(1, chunk // (32 * ELEMS_PER_THREAD))
    if maxnreg is None:
        cap = WELFORD_REG_CAP.get(warps) if sketch and n < WELFORD_REG_CAP_BELOW else None
    else:
        cap = maxnreg or None
    key = ("layernorm-welford", x2.dtype, n, chunk, warps, cap, sketch, packed)
    pf = prefetch_args("layernorm", n, x2, sketch, n_rows + sketch, key, prefetch)
    options = {"N": n, "CHUNK": chunk, "CAP": RATIO_CAP, "SKETCH": sketch, "POLL": poll or RECORD_POLL,
               "EXACT_CHUNK": _common.EXACT_CHUNK, "FINISHER_FIRST": not INTERPRETED,
               "PACKED": x2.element_size() == 2 if packed is None else packed, "PROBE": probe, **pf,
               "num_warps": warps, "enable_fp_fusion": False, **register_cap(cap),
               **({} if INTERPRETED else {"num_stages": 1})}
    # the deferred form (extra): the same grid, its extra program taking only the parameters' partials; its
    # occupancy noted under the same key (the rows' code and registers are the same), so a caller that only
    # defers still gets this plan kept
    later = plan(_layernorm_welford_kernel, (n_rows + sketch,), {**options, "DEFER": True}, key, warps) if sketch \
        else None
    return plan(_layernorm_welford_kernel, (n_rows + sketch,), options, key, warps, extra=(later,))
