"""The attention kernel's input sketch (optwin.kernels.attention): a program's partials, its record, and
the finisher program that reduces the records into the features.

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels import read_sketch; \
from optwin.kernels.attention import attention; q = torch.randn(1, 2, 40, 16); \
print(read_sketch('attention', attention(q, q, q)[1], q.shape))"

Each program's partials (finite entries only): its query tile (|q| max, sum of q^2, max row ||q||^2,
NaN/±inf count), its rows' online-softmax sums (rows with a finite softmax, peaked rows, largest score)
and its share of the key/value tiles (|k| max, sum of k^2, max row ||k||^2, |v| max, counts). Each
group is one reduction tree: the kernel runs one program per SM (128-160 KB of shared memory), so every
barrier at a program's end stalls the SM's tensor cores. The fast path (query_fast, kv_fast_*) takes
maxima and squares only; a non-finite sum sends the program to the exact partials (query_partials,
kv_exact), which re-read its tiles.

Records, not atomics and a ticket: a program stores its partials as RECORD_WORDS int64 words (two 32-bit
halves each, sketch_buffer.row_records) and exits; one extra program, the grid's last, polls the words
(_common.poll_records: a half still at the sentinel is a program still running), reduces them and writes
the features. The ticket's acq_rel fence waited, in every program, for the program's own output
stores, and the ticket's reply was one more L2 round trip after it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from optwin.kernels._common import (
    FMAX,
    INTERPRET,
    finite_lanes,
    poll_records,
    record_word,
    store_common_features,
)

LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
# int64 words per program record. Halves: (|q,k| max, |v| max), (max row ||q||^2, max row ||k||^2),
# (largest scaled score, 0), (sum of squares as float64 hi, lo), (NaN/±inf in q and k, in v), (peaked
# rows, rows with a finite softmax); two words of 0 (the poll reads a power of two of words per row).
RECORD_WORDS: tl.constexpr = tl.constexpr(8)
RECORD_POLL_ROWS = 128  # records the finisher reads per warp and poll: 32 words a thread


@triton.jit
def _max_sum_max_sum(a0, a1, a2, a3, b0, b1, b2, b3):
    return tl.maximum(a0, b0), a1 + b1, tl.maximum(a2, b2), a3 + b3


@triton.jit
def _sum_sum_max(a0, a1, a2, b0, b1, b2):
    return a0 + b0, a1 + b1, tl.maximum(a2, b2)


@triton.jit
def _kv_combine(a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5):
    return tl.maximum(a0, b0), a1 + b1, tl.maximum(a2, b2), a3 + b3, tl.maximum(a4, b4), a5 + b5


@triton.jit
def _max_sum(a0, a1, b0, b1):
    return tl.maximum(a0, b0), a1 + b1


@triton.jit
def _max_max_sum(a0, a1, a2, b0, b1, b2):
    return tl.maximum(a0, b0), tl.maximum(a1, b1), a2 + b2


@triton.jit
def rows_max_sum(r, r64):
    """(max r, sum r64) of per-row vectors (r64: float64 sums): one tree."""
    if INTERPRET:
        return tl.max(r, 0), tl.sum(r64, 0)
    else:
        return tl.reduce((r, r64), 0, _max_sum)


@triton.jit
def query_fast(q):
    """(max |q|, sum of q^2 (float64), max row ||q||^2) of a query tile (padding rows are 0) without a
    finiteness test per entry: a NaN/±inf, or a square past float32, makes the sum non-finite, and the
    caller then takes query_partials' exact path."""
    h = q.to(tl.float32)
    r_n2 = tl.sum(h * h, 1)  # fp32 row ||q||^2
    n2, sq = rows_max_sum(r_n2, r_n2.to(tl.float64))
    return tl.max(tl.abs(h)), sq, n2


@triton.jit
def kv_fast_first(kk, vv):
    """The fast path's partials of the first key/value tile of a program's share (keys outside it read as
    0): elementwise |k| max, |v| max and v^2 sum (tile-shaped, reduced once at the end: no per-tile tree),
    per key row ||k||^2 max and float64 sum. Non-finite entries make a sum non-finite."""
    kh = kk.to(tl.float32)
    vh = vv.to(tl.float32)
    kn2 = tl.sum(kh * kh, 1)
    return tl.abs(kh), tl.abs(vh), vh * vh, kn2, kn2.to(tl.float64)


@triton.jit
def kv_fast_add(kk, vv, k_a, v_a, v_2, k_n2, k_sq):
    """One more tile into kv_fast_first's partials."""
    kh = kk.to(tl.float32)
    vh = vv.to(tl.float32)
    r = tl.sum(kh * kh, 1)
    return (tl.maximum(k_a, tl.abs(kh)), tl.maximum(v_a, tl.abs(vh)), v_2 + vh * vh, tl.maximum(k_n2, r),
            k_sq + r.to(tl.float64))


@triton.jit
def kv_fast_partials(k_a, v_a, v_2, k_n2, k_sq):
    """(|k| max, |v| max, v^2 sum (the non-finite detector), max row ||k||^2, sum of k^2): two trees."""
    if INTERPRET:
        ka, va, v2 = tl.max(k_a), tl.max(v_a), tl.sum(v_2)
    else:
        ka, va, v2 = tl.reduce((k_a, v_a, v_2), None, _max_max_sum)
    n2, sq = rows_max_sum(k_n2, k_sq)
    return ka, va, v2, n2, sq


@triton.jit
def kv_exact(K_blk, V_blk, sks, svs, j_lo, j_hi, j_rr, n_kt, n_m, offs_n, offs_d, seq_k, D: tl.constexpr,
             BLOCK_N: tl.constexpr):
    """The exact partials of a program's share (tiles [j_lo, j_hi), then j_rr, j_rr + n_m, ... < n_kt),
    re-read: finite entries only, NaN/±inf counted. (|k| max, sum of k^2, max row ||k||^2, k's NaN/±inf,
    |v| max, v's NaN/±inf)."""
    k_a, k_sq, k_n2, k_nf, v_a, v_nf = empty_kv_rows(BLOCK_N)
    for j in range(j_lo, j_hi):
        kk, vv, kvm = load_kv_tile(K_blk, V_blk, sks, svs, j, offs_n, offs_d, seq_k, D, BLOCK_N)
        k_a, k_sq, k_n2, k_nf, v_a, v_nf = add_kv_tile(kk, vv, kvm, k_a, k_sq, k_n2, k_nf, v_a, v_nf)
    for j in range(j_rr, n_kt, n_m):
        kk, vv, kvm = load_kv_tile(K_blk, V_blk, sks, svs, j, offs_n, offs_d, seq_k, D, BLOCK_N)
        k_a, k_sq, k_n2, k_nf, v_a, v_nf = add_kv_tile(kk, vv, kvm, k_a, k_sq, k_n2, k_nf, v_a, v_nf)
    return kv_partials(k_a, k_sq, k_n2, k_nf, v_a, v_nf)


@triton.jit
def query_partials(q, row_ok, offs_d, D: tl.constexpr):
    """(|q| max, sum of q^2 (float64), max row ||q||^2, NaN/±inf count (int32)) of a query tile over its
    finite entries; padding rows are outside row_ok. One tree across the warps. The exact path (query_fast's
    sums were not finite)."""
    a, a2, nf = finite_lanes(q.to(tl.float32), row_ok[:, None] & (offs_d[None, :] < D))
    r_a = tl.max(a, 1)
    r_n2 = tl.sum(a2, 1)  # fp32 row ||q||^2
    r_nf = tl.sum(nf, 1).to(tl.int32)
    if INTERPRET:
        return tl.max(r_a, 0), tl.sum(r_n2.to(tl.float64), 0), tl.max(r_n2, 0), tl.sum(r_nf, 0)
    else:
        return tl.reduce((r_a, r_n2.to(tl.float64), r_n2, r_nf), 0, _max_sum_max_sum)


@triton.jit
def row_partials(l_i, t_i, m_i, row_ok, sampled, entropy_nats):
    """(rows with a finite softmax, those peaked, largest m) of a program's rows from the online sums:
    entropy H = ln l - ln2 * t / l in nats, peaked below entropy_nats; finite l and t only (NaN fails
    both tests), and the program's rows only where it summed t (sampled). m is the row's largest scaled
    score (finite rows only), every program's. One tree."""
    ent = tl.log(l_i) - LN2 * t_i / l_i
    fin_row = row_ok & (l_i <= FMAX) & (tl.abs(t_i) <= FMAX) & sampled
    n_fin = fin_row.to(tl.int32)
    n_peak = (fin_row & (ent < entropy_nats)).to(tl.int32)
    m_fin = tl.where(row_ok & (m_i <= FMAX) & (m_i >= -FMAX), m_i, -float("inf"))
    if INTERPRET:
        return tl.sum(n_fin, 0), tl.sum(n_peak, 0), tl.max(m_fin, 0)
    else:
        return tl.reduce((n_fin, n_peak, m_fin), 0, _sum_sum_max)


@triton.jit
def load_kv_tile(K_blk, V_blk, sks, svs, j, offs_n, offs_d, k_end, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key tile j and value tile j ([BLOCK_N, D] each; keys from k_end on read as 0) and their mask."""
    cols = j * BLOCK_N + offs_n
    kvmask = (cols < k_end)[:, None] & (offs_d[None, :] < D)
    kk = tl.load(K_blk + cols[:, None].to(tl.int64) * sks + offs_d[None, :], mask=kvmask, other=0.0)
    vv = tl.load(V_blk + cols[:, None].to(tl.int64) * svs + offs_d[None, :], mask=kvmask, other=0.0)
    return kk, vv, kvmask


@triton.jit
def empty_kv_rows(BLOCK_N: tl.constexpr):
    """Per key row of a tile, across the program's tiles: |k| max, sum of k^2 (float64), max ||k||^2,
    k's NaN/±inf, |v| max, v's NaN/±inf."""
    z = tl.zeros((BLOCK_N,), dtype=tl.float32)
    n = tl.zeros((BLOCK_N,), dtype=tl.int32)
    return z, z.to(tl.float64), z, n, z, n


@triton.jit
def add_kv_tile(kk, vv, kvmask, k_a, k_sq, k_n2, k_nf, v_a, v_nf):
    """A key/value tile's rows into the per-row partials (empty_kv_rows)."""
    ka, ka2, knf = finite_lanes(kk.to(tl.float32), kvmask)
    va, _, vnf = finite_lanes(vv.to(tl.float32), kvmask)
    r_n2 = tl.sum(ka2, 1)  # fp32 row ||k||^2
    return (tl.maximum(k_a, tl.max(ka, 1)), k_sq + r_n2.to(tl.float64), tl.maximum(k_n2, r_n2),
            k_nf + tl.sum(knf, 1).to(tl.int32), tl.maximum(v_a, tl.max(va, 1)), v_nf + tl.sum(vnf, 1).to(tl.int32))


@triton.jit
def kv_partials(k_a, k_sq, k_n2, k_nf, v_a, v_nf):
    """The per-row partials reduced over the rows: one tree."""
    if INTERPRET:
        return (tl.max(k_a, 0), tl.sum(k_sq, 0), tl.max(k_n2, 0), tl.sum(k_nf, 0), tl.max(v_a, 0),
                tl.sum(v_nf, 0))
    else:
        return tl.reduce((k_a, k_sq, k_n2, k_nf, v_a, v_nf), 0, _kv_combine)


@triton.jit
def store_record(R_ptr, pid, amax, vmax, qn2, kn2, mmax, sq, nf, vnf, peak, fin):
    """A program's partials as its RECORD_WORDS record words. sq (float64) is split into two float32,
    hi + lo; no half is ever the sentinel (finite values, -inf, counts >= 0)."""
    hi = sq.to(tl.float32)
    lo = tl.where(hi <= FMAX, (sq - hi.to(tl.float64)).to(tl.float32), 0.0)
    w = tl.arange(0, RECORD_WORDS)
    word = tl.where(w == 0, record_word(amax, vmax),
                    tl.where(w == 1, record_word(qn2, kn2),
                             tl.where(w == 2, record_word(mmax, tl.zeros((), dtype=tl.float32)),
                                      tl.where(w == 3, record_word(hi, lo),
                                               tl.where(w == 4, record_word(nf, vnf),
                                                        tl.where(w == 5, record_word(peak, fin), 0))))))
    tl.store(R_ptr + tl.cast(pid, tl.int64) * RECORD_WORDS + w, word)


@triton.jit
def _pick_max(v, w, k):
    return tl.max(tl.where(w == k, v, -float("inf")), 0)


@triton.jit
def _pick_sum(v, w, k):
    return tl.sum(tl.where(w == k, v, 0), 0)


@triton.jit
def finish_sketch(R_ptr, S_ptr, n_prog, n_batch, n_heads, seq_q, seq_k, qk_scale, D: tl.constexpr,
                  CAUSAL: tl.constexpr, POLL: tl.constexpr):
    """The finisher: polls the n_prog programs' records POLL at a time (resetting them to the sentinel),
    reduces them and writes the attention features."""
    w = tl.arange(0, RECORD_WORDS)
    c_lo = tl.full((RECORD_WORDS,), -float("inf"), tl.float32)  # per word: max of the low halves as float32
    c_hi = tl.full((RECORD_WORDS,), -float("inf"), tl.float32)
    c_sq = tl.zeros((RECORD_WORDS,), dtype=tl.float64)  # word 3's hi + lo
    n_lo = tl.zeros((RECORD_WORDS,), dtype=tl.int64)  # per word: sum of the low halves as integers
    n_hi = tl.zeros((RECORD_WORDS,), dtype=tl.int64)
    for r0 in range(0, n_prog, POLL):
        lo, hi = poll_records(R_ptr, r0, n_prog, POLL, RECORD_WORDS)  # [POLL, RECORD_WORDS] int32
        valid = (r0 + tl.arange(0, POLL) < n_prog)[:, None]
        lo_f = tl.where(valid, lo.to(tl.float32, bitcast=True), -float("inf"))
        hi_f = tl.where(valid, hi.to(tl.float32, bitcast=True), -float("inf"))
        c_lo = tl.maximum(c_lo, tl.max(lo_f, 0))
        c_hi = tl.maximum(c_hi, tl.max(hi_f, 0))
        c_sq += tl.sum(tl.where(valid & (w == 3)[None, :], lo_f.to(tl.float64) + hi_f.to(tl.float64), 0.0), 0)
        n_lo += tl.sum(lo.to(tl.int64), 0)
        n_hi += tl.sum(hi.to(tl.int64), 0)
    g_amax = tl.maximum(_pick_max(c_lo, w, 0), 0.0).to(tl.float64)
    g_vmax = tl.maximum(_pick_max(c_hi, w, 0), 0.0).to(tl.float64)
    g_qn2 = tl.maximum(_pick_max(c_lo, w, 1), 0.0).to(tl.float64)
    g_kn2 = tl.maximum(_pick_max(c_hi, w, 1), 0.0).to(tl.float64)
    g_mmax = _pick_max(c_lo, w, 2).to(tl.float64)
    g_sq = _pick_sum(c_sq, w, 3)
    g_nf = _pick_sum(n_lo, w, 4)
    g_vnf = _pick_sum(n_hi, w, 4)
    g_peak = _pick_sum(n_lo, w, 5)
    g_fin = _pick_sum(n_hi, w, 5)
    n_bh = tl.cast(n_batch, tl.int64) * n_heads
    rows = n_bh * seq_q
    numel_q = rows * D
    numel_k = n_bh * seq_k * D
    store_common_features(S_ptr, numel_q, rows, g_amax, g_sq, numel_q + numel_k - g_nf, g_nf + g_vnf)
    tl.store(S_ptr + 5, tl.cast(n_batch, tl.float64))
    tl.store(S_ptr + 6, tl.cast(n_heads, tl.float64))
    tl.store(S_ptr + 7, tl.cast(seq_q, tl.float64))
    tl.store(S_ptr + 8, tl.cast(seq_k, tl.float64))
    tl.store(S_ptr + 9, tl.full((), D, tl.float64))
    tl.store(S_ptr + 10, tl.full((), 1.0 if CAUSAL else 0.0, tl.float64))
    tl.store(S_ptr + 11, tl.sqrt(g_qn2) * tl.sqrt(g_kn2) / tl.sqrt(tl.full((), D, tl.float64)))
    tl.store(S_ptr + 12, g_vmax)
    tl.store(S_ptr + 13, g_peak.to(tl.float64) / tl.maximum(g_fin, 1).to(tl.float64))
    # m is in log2 units, fp32(q.k) * qk_scale: back to the unscaled q.k (0 with no finite row)
    tl.store(S_ptr + 14, tl.where(g_mmax > -FMAX, g_mmax / tl.cast(qk_scale, tl.float64), 0.0))
