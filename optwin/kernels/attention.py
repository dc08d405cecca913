"""Flash-attention forward in Triton, with the input sketch in the same launch (attention/triton).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.attention import attention; \
q = torch.randn(1, 2, 5, 16); print(attention(q, q, q, causal=True)[0].shape)"

Numerics (what optwin.twin's attention/triton models), per query row, key blocks of BLOCK_N
(optwin.twin.attention.triton_block_n: part of the numerics) from key 0:
    x = tl.dot(q, k^T) * c        fp32 accumulation (fp16/bf16 tensor cores; fp32 inputs use
                                  input_precision="ieee", no tf32); c = fp32(log2(e)/sqrt(d))
    m' = max(m, rowmax(x))        exact; m starts at -inf
    a = exp2(m - m'); p = exp2(x - m')      ex2.approx.f32 on NVIDIA (numpy in the interpreter);
                                            masked keys are -inf, p = 0
    l = l*a + tl.sum(p)           fp32 tree per block
    acc = acc*a + tl.dot(p.to(dtype), v)    fp32 accumulator (fp32 inputs keep fp32 p)
    y = (acc / l).to(dtype)       fp32 division, one rounding at the store
The causal mask is top-left aligned as torch sdpa's is_causal (query i sees keys j <= i), so every
row keeps key 0 and no row is fully masked, whatever seq_q and seq_k are.

Sketch (SKETCH constexpr; off compiles no sketch code): optwin.ingest.sketch's attention features,
gathered by optwin.kernels.attention_sketch. Every program: its query tile (|q| max, sum of q^2, max
row ||q||^2), its rows' largest score (max_score = max m / c: the online max is the row's score
maximum), and its share of the key/value tiles: the tiles that start inside its own query range,
which its key loop read last (L2 hits, causal or not), then round robin the tiles past every
program's range (seq_k > seq_q); every key row of a (batch, head) exactly once. |k| max, sum of k^2,
max row ||k||^2, |v| max. Those run without a finiteness test per entry (max and squares only); a
NaN/±inf, or a square past float32, makes a sum non-finite and the program then re-reads its tiles for
the exact finite-only partials and the NaN/±inf counts.
Entropies from the online softmax, H = ln l - ln2 * t / l with t = sum p*(x - m) rescaled like l
(t' = a*(t + l*(m - m')) + sum p*(x - m')), rows with H < low_entropy_nats counted as peaked among the
rows whose l and t are finite (ingest's "rows with a finite softmax"; a score that overflows fp32 to
-inf outside the mask makes t NaN and drops the row, where ingest's float64 scores would count it).
t costs the key loop a multiply-add per score, so from 2 * ENTROPY_ROWS query rows on only every
ent_stride-th query block sums it (by (block + head): every position alike), and peaked_frac is over
that sample (>= 2^16 rows; optwin.ingest's own sample is 2^22 scores, 8 rows a head at [4, 32, 4096,
128]). t rides in the key loop, the rest runs after the output store, and none of it touches m, l or
acc: y is bit-identical with and without the sketch (checked on the H200 too).
Each program stores its partials as a record (attention_sketch.RECORD_WORDS int64 words) and exits; the
grid's last program polls the records and writes the features. Per-row values are fp32, cross-program
sums float64: features agree with optwin.ingest to float32 rounding; peaked_frac may differ where a
row's fp32 entropy straddles the threshold.
Grid: one program per (query block, batch*head), head-major: a head's query blocks run side by side
(causal: its longest first), so each head's keys and values come from DRAM once and from the L2 for
its other query blocks. Until stop 24 the programs ran a query block of every head side by side (the
other order): with 128 heads of 2 MB of keys and values each, every program streamed its head's keys
from DRAM, and the kernel was bound by it.
Memory: read q once, k and v once per head (L2 reuse across its query blocks), write y once.
H200, [4, 32, 4096, 128] bf16, default config, ms (bench/results/attention_order_h200_s24.txt, 5
interleaved rounds): non-causal 2.995 -> 2.406 head-major (sdpa 1.882: 0.63x -> 0.78x), causal 1.591 ->
1.361 (sdpa 1.056: 0.66x -> 0.78x); bench/gpu_attention.py (bench/results/attention_h200_s24.md): 2.416
/ 1.337 ms (455 / 411 TFLOP/s) against sdpa's 1.677 / 0.952 in that run (0.69x / 0.71x).
The sketch's cost, 7 interleaved rounds (bench/results/attention_ab_h200_s25d.md): +15.5 % / +15.7 % with
stop 24's sketch (workspace atomics and an acq_rel ticket per program, a tree per statistic, the share
j = mb, mb + n_m, ...) -> +2.1 % / +9.1 % (records, a tree per group, the fast path, the own-range share,
sampled entropies); with causal launches at 4 stages (default_config) +1.5 % / +3.5 %: 2.407 / 2.444 and
1.364 / 1.413 ms (bench/results/attention_h200_s25f.md). The unfused float64 ingest sketch takes 8.6 ms.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from optwin.catalog import DEFAULT_TOLERANCES
from optwin.errors import InputError
from optwin.kernels._common import DTYPES, FMAX, INTERPRET, cdiv, check_device, store_cast
from optwin.kernels.attention_sketch import (
    RECORD_POLL_ROWS,
    RECORD_WORDS,
    finish_sketch,
    kv_exact,
    kv_fast_add,
    kv_fast_first,
    kv_fast_partials,
    load_kv_tile,
    query_fast,
    query_partials,
    row_partials,
    store_record,
)
from optwin.kernels.fast_launch import launch
from optwin.kernels.sketch_buffer import feature_names, new_buffer, row_records
from optwin.twin.attention import triton_block_n, triton_qk_scale

assert feature_names("attention") == (
    "numel", "rows", "absmax", "rms", "nonfinite", "batch", "heads", "seq_q", "seq_k", "d", "causal",
    "score_bound", "v_absmax", "peaked_frac", "max_score")

LAST_COMPILED: list = [None]  # the last launch's compiled kernel (the bench reads its registers)


@triton.jit
def _key_block(acc, l_i, m_i, t_i, q, K_blk, V_blk, sks, svs, start_n, offs_m, offs_n, offs_d, seq_k, qk_scale,
               sampled, MASKED: tl.constexpr, CAUSAL: tl.constexpr, SKETCH: tl.constexpr, IEEE: tl.constexpr):
    """One key block [start_n, start_n + BLOCK_N): the online-softmax step. MASKED blocks (the causal
    diagonal, the ragged tail) mask keys by -inf; the others load and compute without masks."""
    cols = start_n + offs_n  # (BLOCK_N,)
    k_ptrs = K_blk + cols[:, None].to(tl.int64) * sks + offs_d[None, :]  # (BLOCK_N, D)
    v_ptrs = V_blk + cols[:, None].to(tl.int64) * svs + offs_d[None, :]  # (BLOCK_N, D)
    if MASKED:
        k = tl.load(k_ptrs, mask=(cols < seq_k)[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
    if INTERPRET and k.dtype == tl.bfloat16:  # the interpreter's dot reads bf16 as raw bits: upcast (exact)
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
    elif IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")  # (BLOCK_M, BLOCK_N) fp32
    else:
        s = tl.dot(q, tl.trans(k))  # (BLOCK_M, BLOCK_N) fp32 accumulation
    x = s * qk_scale  # base-2 scores
    if MASKED:
        keep = cols[None, :] < seq_k
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])  # top-left aligned
        x = tl.where(keep, x, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(x, 1))  # (BLOCK_M,)
    dx = x - m_new[:, None]  # (BLOCK_M, BLOCK_N) <= 0; -inf where masked
    p = tl.math.exp2(dx)
    alpha = tl.math.exp2(m_i - m_new)  # 0 on the first block (m_i = -inf)
    if SKETCH:  # noqa: SIM102 - a constexpr branch
        if sampled:  # t = sum p*(x - m), rescaled to the new max like l; l = 0 before the first block
            pd = p * dx
            if MASKED:
                pd = tl.where(keep, pd, 0.0)  # 0 * -inf
            t_i = alpha * (t_i + tl.where(l_i > 0, l_i * (m_i - m_new), 0.0)) + tl.sum(pd, 1)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if MASKED:
        v = tl.load(v_ptrs, mask=(cols < seq_k)[:, None], other=0.0)
    else:
        v = tl.load(v_ptrs)
    if INTERPRET and v.dtype == tl.bfloat16:  # p still rounded to bf16 first
        acc = tl.dot(store_cast(p, v.dtype).to(tl.float32), v.to(tl.float32), acc)
    elif IEEE:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)  # (BLOCK_M, D) fp32
    return acc, l_i, m_new, t_i


@triton.jit
def key_blocks(mb, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(lo, hi) for query block mb: unmasked key blocks [0, lo), then masked ones [lo, hi) (the causal
    diagonal, the ragged tail); both start on multiples of BLOCK_N."""
    full_end = (seq_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        hi = tl.minimum((mb + 1) * BLOCK_M, seq_k)
        lo = (tl.minimum(mb * BLOCK_M, full_end) // BLOCK_N) * BLOCK_N
    else:
        hi = seq_k
        lo = full_end
    return lo, hi


# Sizes are not specialized on (== 1, divisible by 16): every distinct combination over five sizes
# compiled a kernel of its own, and a float32 (IEEE FMA dot) compile takes tens of seconds, so a
# run over varied shapes spent minutes compiling. They only bound loops and masks here; the strides,
# which decide vector widths, stay specialized. ent_stride (1, 2, 4, ...) too: specialized, 1 and the
# multiples of 16 compiled kernels of their own.
@triton.jit(do_not_specialize=["n_batch", "n_heads", "seq_q", "seq_k", "n_m", "ent_stride"])
def _attention_kernel(
    Q, K, V, Y,  # (B, H, S, D) each, last dim contiguous; Y contiguous in q's dtype
    S_ptr,  # sketch features, float64; unused unless SKETCH
    R_ptr,  # program records, int64 (>= programs * RECORD_WORDS), all -1 (sketch_buffer.row_records)
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, syb, syh, sys,
    n_batch, n_heads, seq_q, seq_k, n_m,  # n_m = cdiv(seq_q, BLOCK_M)
    qk_scale,  # fp32 log2(e)/sqrt(d)
    entropy_nats,  # fp32 low-entropy threshold
    ent_stride,  # the query blocks whose rows' entropies the sketch sums: (mb + bh) % ent_stride == 0
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    SKETCH: tl.constexpr, IEEE: tl.constexpr, ENTROPY: tl.constexpr, KV_STATS: tl.constexpr,
    KV_AHEAD: tl.constexpr,  # key/value tiles of the sketch's share loaded before y's store (1 or 2)
    POLL: tl.constexpr,  # records the finisher reads at once
    HEAD_MAJOR: tl.constexpr = True,  # program order (speed only; False: stop 23's order, for the bench)
):
    pid = tl.program_id(0)
    n_prog = n_m * n_batch * n_heads
    if SKETCH and pid == n_prog:  # the grid's last program: the sketch's finisher
        finish_sketch(R_ptr, S_ptr, n_prog, n_batch, n_heads, seq_q, seq_k, qk_scale, D, CAUSAL, POLL)
    else:
        _query_block(Q, K, V, Y, R_ptr, sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, syb, syh, sys,
                     n_batch, n_heads, seq_q, seq_k, n_m, qk_scale, entropy_nats, ent_stride, D, BLOCK_M, BLOCK_N, CAUSAL,
                     SKETCH, IEEE, ENTROPY, KV_STATS, KV_AHEAD, HEAD_MAJOR)


@triton.jit
def _query_block(
    Q, K, V, Y, R_ptr, sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, syb, syh, sys,
    n_batch, n_heads, seq_q, seq_k, n_m, qk_scale, entropy_nats, ent_stride,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    SKETCH: tl.constexpr, IEEE: tl.constexpr, ENTROPY: tl.constexpr, KV_STATS: tl.constexpr,
    KV_AHEAD: tl.constexpr, HEAD_MAJOR: tl.constexpr,
):
    """One program's query block: the forward, then (SKETCH) its partials into its record."""
    pid = tl.program_id(0)
    n_bh = n_batch * n_heads
    if HEAD_MAJOR:  # a head's query blocks run side by side: its keys and values are read from the L2
        bh = pid // n_m
        mb = pid % n_m
    else:  # a query block of every head side by side: each program streams its head's keys from DRAM
        bh = pid % n_bh
        mb = pid // n_bh
    if CAUSAL:
        mb = n_m - 1 - mb  # longest rows first: the short ones fill the tail
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    Q_blk = Q + b * sqb + h * sqh
    K_blk = K + b * skb + h * skh
    V_blk = V + b * svb + h * svh
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < seq_q
    q = tl.load(Q_blk + offs_m[:, None].to(tl.int64) * sqs + offs_d[None, :], mask=row_ok[:, None], other=0.0)

    m_i = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    t_i = tl.zeros((BLOCK_M,), dtype=tl.float32)  # sketch only (dead code without it)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    lo, hi = key_blocks(mb, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    # the entropy sums of a sample of the query blocks (every block where ent_stride is 1): each head samples
    # other block positions, so the sample covers every position alike
    sampled = (mb + bh) % ent_stride == 0
    for start_n in range(0, lo, BLOCK_N):
        acc, l_i, m_i, t_i = _key_block(acc, l_i, m_i, t_i, q, K_blk, V_blk, sks, svs, start_n, offs_m, offs_n,
                                        offs_d, seq_k, qk_scale, sampled, False, CAUSAL, ENTROPY, IEEE)
    for start_n in range(lo, hi, BLOCK_N):
        acc, l_i, m_i, t_i = _key_block(acc, l_i, m_i, t_i, q, K_blk, V_blk, sks, svs, start_n, offs_m, offs_n,
                                        offs_d, seq_k, qk_scale, sampled, True, CAUSAL, ENTROPY, IEEE)
    if SKETCH and KV_STATS:
        # the program's share of the key/value tiles: those starting inside its own query range [mb*BM,
        # (mb+1)*BM), which its loop read last, causal or not (L2 hits), then round robin the tiles past
        # every program's range (seq_k > seq_q); every tile of a head exactly once. The first KV_AHEAD are
        # loaded here, so their latency passes during y's store
        n_kt = tl.cdiv(seq_k, BLOCK_N)
        j_lo = tl.cdiv(mb * BLOCK_M, BLOCK_N)
        j_hi = tl.minimum(tl.cdiv((mb + 1) * BLOCK_M, BLOCK_N), n_kt)
        k_end = tl.minimum(j_hi * BLOCK_N, seq_k)  # keys past it are other programs' (all masked if j_hi <= j_lo)
        kk0, vv0, _ = load_kv_tile(K_blk, V_blk, sks, svs, j_lo, offs_n, offs_d, k_end, D, BLOCK_N)
        if KV_AHEAD == 2:
            kk1, vv1, _ = load_kv_tile(K_blk, V_blk, sks, svs, j_lo + 1, offs_n, offs_d, k_end, D, BLOCK_N)
    y = acc / l_i[:, None]
    Y_blk = Y + b * syb + h * syh
    tl.store(Y_blk + offs_m[:, None].to(tl.int64) * sys + offs_d[None, :], store_cast(y, Y.dtype.element_ty),
             mask=row_ok[:, None])

    if SKETCH:
        p_fin, p_peak, p_mmax = row_partials(l_i, t_i, m_i, row_ok, sampled, entropy_nats)
        # the fast path: no finiteness test per entry; NaN/±inf (or squares past float32) make a sum
        # non-finite, and then the program's tiles are read again for the exact partials
        p_amax, p_sq, p_qn2 = query_fast(q)
        p_nf = tl.zeros((), dtype=tl.int32)
        p_ka = tl.zeros((), dtype=tl.float32)
        p_vmax = tl.zeros((), dtype=tl.float32)
        p_v2 = tl.zeros((), dtype=tl.float32)
        p_kn2 = tl.zeros((), dtype=tl.float32)
        p_ksq = tl.zeros((), dtype=tl.float64)
        p_knf = tl.zeros((), dtype=tl.int32)
        p_vnf = tl.zeros((), dtype=tl.int32)
        if KV_STATS:
            j_rr = tl.cdiv(n_m * BLOCK_M, BLOCK_N) + mb  # the round robin past every program's range
            k_a, v_a, v_2, k_n2, k_sq = kv_fast_first(kk0, vv0)
            if KV_AHEAD == 2:
                k_a, v_a, v_2, k_n2, k_sq = kv_fast_add(kk1, vv1, k_a, v_a, v_2, k_n2, k_sq)
            for j in range(j_lo + KV_AHEAD, j_hi):  # BLOCK_M / BLOCK_N > KV_AHEAD
                kk, vv, _ = load_kv_tile(K_blk, V_blk, sks, svs, j, offs_n, offs_d, seq_k, D, BLOCK_N)
                k_a, v_a, v_2, k_n2, k_sq = kv_fast_add(kk, vv, k_a, v_a, v_2, k_n2, k_sq)
            for j in range(j_rr, n_kt, n_m):
                kk, vv, _ = load_kv_tile(K_blk, V_blk, sks, svs, j, offs_n, offs_d, seq_k, D, BLOCK_N)
                k_a, v_a, v_2, k_n2, k_sq = kv_fast_add(kk, vv, k_a, v_a, v_2, k_n2, k_sq)
            p_ka, p_vmax, p_v2, p_kn2, p_ksq = kv_fast_partials(k_a, v_a, v_2, k_n2, k_sq)
        if not (p_sq + p_ksq + p_v2.to(tl.float64) <= FMAX):  # rare: the exact partials (NaN fails the test)
            p_amax, p_sq, p_qn2, p_nf = query_partials(q, row_ok, offs_d, D)
            if KV_STATS:
                p_ka, p_ksq, p_kn2, p_knf, p_vmax, p_vnf = kv_exact(K_blk, V_blk, sks, svs, j_lo, j_hi, j_rr, n_kt,
                                                                    n_m, offs_n, offs_d, seq_k, D, BLOCK_N)
        store_record(R_ptr, pid, tl.maximum(p_amax, p_ka), p_vmax, p_qn2, p_kn2, p_mmax, p_sq + p_ksq,
                     p_nf + p_knf, p_vnf, p_peak, p_fin)


def default_config(dtype: torch.dtype, d: int, causal: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a head dim d. BLOCK_N is the twin's (numerics);
    the rest only sets speed. Interpreter: the same blocks (tests exercise the real tiling).
    Causal 16-bit launches load 4 key blocks ahead: H200, [4, 32, 4096, 128] bf16, 7 interleaved rounds, ms
    without / with the sketch, 3 -> 4 stages: causal 1.380 / 1.492 -> 1.350 / 1.417, non-causal 2.464 / 2.461 ->
    2.484 / 2.479 (bench/results/attention_s4_h200_s25e.md; the sweeps of stops 24-25 agree: causal 1.337 ->
    1.300, 1.324 -> 1.302; non-causal 2.416 -> 2.480, 2.405 -> 2.382)."""
    name = str(dtype).removeprefix("torch.")
    bn = triton_block_n(name, d)
    if dtype == torch.float32:
        return 64, bn, 4, 1 if d >= 256 else 2
    if d >= 256:
        return 64, bn, 4, 2
    return 128, bn, 8, 4 if causal else 3


# Query rows whose entropies the sketch sums, at least: from twice as many on, a sample of the query blocks (peaked_frac
# over the sample). optwin.ingest forms the scores of at most 2^22 elements (a strided row sample: 8 rows of
# each head at [4, 32, 4096, 128]); the kernel's sample holds 2^16 rows or more. The entropy sum costs the
# key loop a multiply-add per score: H200, [4, 32, 4096, 128] bf16, ms with the sketch, every row -> every 8th
# block: non-causal 2.732 -> 2.508 and 2.551 -> 2.463, causal 1.550 -> 1.584 and 1.472 -> 1.481 (no gain:
# the key loop's branch on it), two runs (bench/results/attention_ab_h200_s25{c,d}.md)
ENTROPY_ROWS = 1 << 16


def entropy_stride(rows: int, n_m: int) -> int:
    """Every ent_stride-th query block (by (mb + bh) % ent_stride) sums its rows' entropies: the largest
    power of two that keeps >= ENTROPY_ROWS rows, 1 (every block) for launches of fewer, and at most the
    query blocks of a head (n_m), so every head keeps one."""
    stride = 1
    while rows // (2 * stride) >= ENTROPY_ROWS and 2 * stride <= n_m:
        stride *= 2
    return stride


def kv_ahead(block_n: int, d: int, warps: int, elem_bytes: int) -> int:
    """Key/value tiles of the sketch's share loaded before y's store: 2 where a thread's four tiles
    take <= 64 registers (16-bit [64, 128] tiles at 8 warps: 64 bytes a tile), else 1."""
    return 2 if block_n * d * elem_bytes // (32 * warps) <= 64 else 1


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """One-line InputError unless q, k, v are (B, H, S, D) of one float dtype, with matching B, H, D,
    k and v of one length, D a power of two in 16..256."""
    for n, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4:
            raise InputError(f"attention: {n} must be (batch, heads, seq, d), got shape {tuple(t.shape)}")
        if t.dtype != q.dtype or t.dtype not in DTYPES:
            raise InputError(f"attention: q, k, v must share one of float16/bfloat16/float32, got {n} {t.dtype} (q {q.dtype})")
    b, h, _, d = q.shape
    if k.shape[:2] != (b, h) or v.shape[:2] != (b, h) or k.shape[2] != v.shape[2]:
        raise InputError(f"attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} disagree")
    if k.shape[3] != d or v.shape[3] != d:
        raise InputError(f"attention: q, k and v need one head dim, got {d}, {k.shape[3]}, {v.shape[3]}")
    if d < 16 or d > 256 or d & (d - 1):
        raise InputError(f"attention: head dim {d} not supported (a power of two in 16..256)")


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sketch: bool = True, *,
    out: torch.Tensor | None = None, low_entropy_nats: float = DEFAULT_TOLERANCES.low_entropy_nats,
    config: tuple[int, int, int, int] | None = None, _parts: tuple[bool, bool] = (True, True),
    _head_major: bool = True, _kv_ahead: int | None = None, _entropy_stride: int | None = None,
    _poll: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(softmax(q k^T / sqrt(d)) v in q's dtype, sketch features or None), one launch.

    `out`: a contiguous (B, H, Sq, D) tensor of q's dtype to write y into (the bench poisons it).
    `config`: (BLOCK_M, BLOCK_N, num_warps, num_stages) for the bench's sweep; a BLOCK_N other than
    default_config's is not the catalog variant's numerics. Read the features with
    optwin.kernels.read_sketch("attention", buf).
    `_parts` (bench only: the sketch is then incomplete): (entropy on, key/value statistics on), to
    time the sketch's pieces. `_head_major`, `_kv_ahead` (bench only): the program order, the key/value
    tiles loaded before y's store (kv_ahead's choice by default); neither changes y or the sketch. `_poll`
    (tests): records the finisher reads at once (a power of two).
    """
    check_device(q, k, v)
    check_inputs(q, k, v)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    bsz, heads, seq_q, d = q.shape
    seq_k = k.shape[2]
    if out is None:
        y = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (B, H, Sq, D)
    else:
        if tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or out.stride(-1) != 1:
            raise InputError(f"attention: out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim")
        y = out
    bm, bn, warps, stages = config or default_config(q.dtype, d, bool(causal))
    buf = new_buffer("attention", q.device) if sketch else None
    if (seq_q == 0 or bsz * heads == 0) and not sketch:
        return y, None
    if seq_q == 0 or seq_k == 0 or bsz * heads == 0:
        raise InputError(f"attention: empty inputs q {tuple(q.shape)}, k {tuple(k.shape)}")
    n_m = cdiv(seq_q, bm)
    n_prog = n_m * bsz * heads
    rec = row_records("attention", q.device, n_prog, words=RECORD_WORDS.value, extra=1)[0] if sketch else y
    kwargs = {} if os.environ.get("TRITON_INTERPRET") == "1" else {"num_stages": stages}
    k = launch(_attention_kernel, (n_prog + 1 if sketch else n_prog,),
        q, k, v, y, buf if sketch else y, rec,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *y.stride()[:3],
        bsz, heads, seq_q, seq_k, n_m, triton_qk_scale(d), float(low_entropy_nats),
        _entropy_stride or entropy_stride(bsz * heads * seq_q, n_m),
        D=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=bool(causal), SKETCH=sketch, IEEE=q.dtype == torch.float32,
        ENTROPY=sketch and _parts[0], KV_STATS=_parts[1], KV_AHEAD=_kv_ahead or kv_ahead(bn, d, warps, q.element_size()),
        POLL=_poll or RECORD_POLL_ROWS * warps, HEAD_MAJOR=_head_major, num_warps=warps, **kwargs,
    )
    LAST_COMPILED[0] = k
    return y, buf


def attention_flops(bsz: int, heads: int, seq_q: int, seq_k: int, d: int, causal: bool) -> float:
    """Matrix FLOPs of the forward (2 products of 2*Sq*Sk*D each; causal: the visible half)."""
    f = 4.0 * bsz * heads * seq_q * seq_k * d
    return f / 2 if causal else f

