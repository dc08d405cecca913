"""Attention's key/value loads through TMA descriptors against pointer loads (issue #6's stretch goal: as
fast as sdpa), timed side by side in interleaved rounds with the shipped kernel and sdpa.

    python bench/attention_tma.py                      # on a CUDA machine; writes $OUT/attention_tma.md
    BENCH_ROUNDS=3 BENCH_SHAPE=4x32x4096x128 python bench/attention_tma.py

The probe kernel is the shipped forward without the sketch (optwin.kernels.attention's numerics: the
same key blocks, the same exp2 and the same products), in two forms: keys and values read through
pointers (as shipped), or, in the unmasked key blocks, through host TMA descriptors over the
(B*H*S, D) views (the masked blocks, the causal diagonal and the ragged tail, keep pointer loads: a
descriptor row past a head's keys is the next head's). y must match the shipped kernel's bit for bit.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton
import triton.language as tl

from optwin.kernels.attention import (
    attention,
    attention_flops,
    default_config,
    key_blocks,
)
from optwin.twin.attention import triton_qk_scale

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
SHAPE = tuple(int(v) for v in os.environ.get("BENCH_SHAPE", "4x32x4096x128").split("x"))


@triton.jit
def _block(acc, l_i, m_i, q, k, v_ptrs, start_n, offs_m, offs_n, seq_k, qk_scale, MASKED: tl.constexpr,
           CAUSAL: tl.constexpr):
    """optwin.kernels.attention._key_block's online-softmax step on a loaded key tile k."""
    s = tl.dot(q, tl.trans(k))
    x = s * qk_scale
    cols = start_n + offs_n
    if MASKED:
        keep = cols[None, :] < seq_k
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        x = tl.where(keep, x, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(x, 1))
    p = tl.math.exp2(x - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    return acc, l_i, m_new, p


@triton.jit
def _probe_kernel(Q, K, V, Y, desc_k, desc_v, sqs, sks, svs, sys, n_m, seq_q, seq_k, qk_scale,
                  D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                  TMA: tl.constexpr):
    pid = tl.program_id(0)
    bh = pid // n_m  # head-major, as shipped
    mb = pid % n_m
    if CAUSAL:
        mb = n_m - 1 - mb
    Q_blk = Q + bh.to(tl.int64) * seq_q * sqs
    K_blk = K + bh.to(tl.int64) * seq_k * sks
    V_blk = V + bh.to(tl.int64) * seq_k * svs
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < seq_q
    q = tl.load(Q_blk + offs_m[:, None].to(tl.int64) * sqs + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    lo, hi = key_blocks(mb, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    row0 = bh * seq_k
    for start_n in range(0, lo, BLOCK_N):
        if TMA:
            k = desc_k.load([row0 + start_n, 0])
        else:
            k = tl.load(K_blk + (start_n + offs_n)[:, None].to(tl.int64) * sks + offs_d[None, :])
        acc, l_i, m_i, p = _block(acc, l_i, m_i, q, k, V_blk, start_n, offs_m, offs_n, seq_k, qk_scale, False, CAUSAL)
        if TMA:
            v = desc_v.load([row0 + start_n, 0])
        else:
            v = tl.load(V_blk + (start_n + offs_n)[:, None].to(tl.int64) * svs + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K_blk + cols[:, None].to(tl.int64) * sks + offs_d[None, :], mask=(cols < seq_k)[:, None], other=0.0)
        acc, l_i, m_i, p = _block(acc, l_i, m_i, q, k, V_blk, start_n, offs_m, offs_n, seq_k, qk_scale, True, CAUSAL)
        v = tl.load(V_blk + cols[:, None].to(tl.int64) * svs + offs_d[None, :], mask=(cols < seq_k)[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
    y = acc / l_i[:, None]
    tl.store(Y + bh.to(tl.int64) * seq_q * sys + offs_m[:, None].to(tl.int64) * sys + offs_d[None, :],
             y.to(Y.dtype.element_ty), mask=row_ok[:, None])


def probe(q, k, v, causal, tma, config):
    from triton.tools.tensor_descriptor import TensorDescriptor

    bsz, heads, seq_q, d = q.shape
    seq_k = k.shape[2]
    bm, bn, warps, stages = config
    y = torch.empty_like(q)
    k2, v2 = k.reshape(-1, d), v.reshape(-1, d)
    dk = TensorDescriptor.from_tensor(k2, [bn, d]) if tma else k2
    dv = TensorDescriptor.from_tensor(v2, [bn, d]) if tma else v2
    n_m = triton.cdiv(seq_q, bm)
    _probe_kernel[(n_m * bsz * heads,)](q, k, v, y, dk, dv, q.stride(2), k.stride(2), v.stride(2), y.stride(2),
                                        n_m, seq_q, seq_k, triton_qk_scale(d), D=d, BLOCK_M=bm, BLOCK_N=bn,
                                        CAUSAL=causal, TMA=tma, num_warps=warps, num_stages=stages)
    return y


def main() -> None:
    torch.manual_seed(0)
    b, h, s, d = SHAPE
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    lines = [f"# Attention: TMA key/value loads against pointers, {torch.cuda.get_device_name()}, "
             f"[{b}, {h}, {s}, {d}] bf16, {ROUNDS} interleaved rounds (do_bench, ms)", ""]
    for causal in (False, True):
        base = default_config(q.dtype, d, causal)
        ref = attention(q, k, v, causal=causal, sketch=False)[0]
        entries = {"sdpa": lambda c=causal: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=c),
                   "shipped": lambda c=causal: attention(q, k, v, causal=c, sketch=False)}
        checks = {}
        bm, bn, w, st = base
        for tma in (False, True):
            for cfg in ((bm, bn, w, st), (bm, bn, w, 2), (bm, bn, w, 3), (bm, bn, w, 4), (bm, bn, 4, st)):
                name = f"{'tma' if tma else 'ptr'} {cfg}"
                if name in entries:
                    continue
                try:
                    y = probe(q, k, v, causal, tma, cfg)
                except Exception as e:  # noqa: BLE001 - a config the compiler refuses is a result too
                    checks[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
                    continue
                checks[name] = "y = shipped" if torch.equal(y, ref) else f"max |dy| {(y.float() - ref.float()).abs().max().item():.3g}"
                entries[name] = lambda c=causal, t=tma, g=cfg: probe(q, k, v, c, t, g)
        times = {n: [] for n in entries}
        for _ in range(ROUNDS):
            for n, f in entries.items():
                times[n].append(triton.testing.do_bench(f, warmup=25, rep=100))
        flops = attention_flops(b, h, s, s, d, causal)
        lines += [f"## causal={causal} (shipped config {base})", "",
                  "| entry | ms (median) | min | max | TFLOP/s | vs sdpa | check |", "|---|---:|---:|---:|---:|---:|---|"]
        sd = statistics.median(times["sdpa"])
        for n, ts in times.items():
            med = statistics.median(ts)
            lines.append(f"| {n} | {med:.3f} | {min(ts):.3f} | {max(ts):.3f} | {flops / med / 1e9:.0f} | "
                         f"{sd / med:.2f}x | {checks.get(n, '')} |")
        lines += [f"| {n} | - | - | - | - | - | {c} |" for n, c in checks.items() if n not in times]
        lines.append("")
    text = "\n".join(lines)
    print(text)
    out = Path(os.environ.get("OUT", "."))
    (out / "attention_tma.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
