"""What limits our Triton flash attention on the GPU: a stripped forward (no sketch) timed over the
choices the production kernel (optwin.kernels.attention) could make, against torch sdpa.

    python bench/attention_probe.py         # on a CUDA machine; writes $OUT/attention_probe.md when OUT is set
    TRITON_INTERPRET=1 python bench/attention_probe.py --smoke   # CPU: every variant against float64, tiny shapes

Choices: K/V loads through pointers or tensor descriptors (TMA on Hopper; DESC 2: a 2-d view of
(B*H*S, D), DESC 3: (B*H, S, D), which zero-fills past a head's last key), the loop warp-specialized
or not, (BLOCK_M, BLOCK_N, warps, stages), and where the scale goes (SCALED 0: x = s*c, then x - m, as
the production kernel and its twin; 1: m from max(s)*c and one FMA s*c - m per score, as Triton's
tutorial). Every variant's y is checked against float64 before it is timed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from optwin.kernels.attention import (
    attention,
    attention_flops,
    default_config,
    key_blocks,
)

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
LOG2E = 1.4426950408889634
LINES: list[str] = []
LAST: list = [None]  # the last probe launch's compiled kernel (registers, spills)


def say(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


@triton.jit
def _load_kv(ptr_or_desc, bh, row, offs_n, offs_d, stride_s, seq_k, DESC: tl.constexpr, MASKED: tl.constexpr,
             BLOCK_N: tl.constexpr, D: tl.constexpr):
    if DESC == 2:
        return ptr_or_desc.load([bh * seq_k + row, 0])
    elif DESC == 3:
        return ptr_or_desc.load([bh, row, 0]).reshape(BLOCK_N, D)
    else:
        ptrs = ptr_or_desc + bh.to(tl.int64) * seq_k * stride_s + (row + offs_n)[:, None].to(tl.int64) * stride_s + offs_d[None, :]
        if MASKED:
            return tl.load(ptrs, mask=((row + offs_n) < seq_k)[:, None], other=0.0)
        else:
            return tl.load(ptrs)


@triton.jit
def _scores(q, K, bh, start_n, offs_m, offs_n, offs_d, stride_s, seq_k, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
            DESC: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    k = _load_kv(K, bh, start_n, offs_n, offs_d, stride_s, seq_k, DESC, MASKED, BLOCK_N, D)
    s = tl.dot(q, tl.trans(k))
    if MASKED:
        cols = start_n + offs_n
        keep = cols[None, :] < seq_k
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        s = tl.where(keep, s, -float("inf"))
    return s


@triton.jit
def _update(acc, l_i, m_i, s, V, bh, start_n, offs_n, offs_d, stride_s, seq_k, qk_scale, MASKED: tl.constexpr,
            DESC: tl.constexpr, SCALED: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    if SCALED == 1:
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
    else:
        x = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(x, 1))
        p = tl.math.exp2(x - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_ij = tl.sum(p, 1)
    acc = acc * alpha[:, None]
    v = _load_kv(V, bh, start_n, offs_n, offs_d, stride_s, seq_k, DESC, MASKED, BLOCK_N, D)
    acc = tl.dot(p.to(v.dtype), v, acc)
    l_i = l_i * alpha + l_ij
    return acc, l_i, m_new


@triton.jit
def _step(acc, l_i, m_i, q, K, V, bh, start_n, offs_m, offs_n, offs_d, stride_s, seq_k, qk_scale,
          MASKED: tl.constexpr, CAUSAL: tl.constexpr, DESC: tl.constexpr, SCALED: tl.constexpr,
          BLOCK_N: tl.constexpr, D: tl.constexpr):
    s = _scores(q, K, bh, start_n, offs_m, offs_n, offs_d, stride_s, seq_k, MASKED, CAUSAL, DESC, BLOCK_N, D)
    return _update(acc, l_i, m_i, s, V, bh, start_n, offs_n, offs_d, stride_s, seq_k, qk_scale, MASKED, DESC, SCALED,
                   BLOCK_N, D)


@triton.jit
def _probe_fwd(Q, K, V, Y, stride_s, seq_q, seq_k, n_bh, qk_scale,
               D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
               DESC: tl.constexpr, WS: tl.constexpr, SCALED: tl.constexpr, PIPE: tl.constexpr,
               HEAD_MAJOR: tl.constexpr):
    pid = tl.program_id(0)
    n_m = tl.cdiv(seq_q, BLOCK_M)
    if HEAD_MAJOR:  # a head's query blocks side by side (its keys stay in the L2)
        bh = pid // n_m
        mb = pid % n_m
    else:
        bh = pid % n_bh
        mb = pid // n_bh
    if CAUSAL:
        mb = n_m - 1 - mb
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    base_q = bh.to(tl.int64) * seq_q * stride_s
    row_ok = offs_m < seq_q
    q = tl.load(Q + base_q + offs_m[:, None].to(tl.int64) * stride_s + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    lo, hi = key_blocks(mb, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    if PIPE:  # block j+1's scores are asked for before block j's softmax (wgmma is asynchronous)
        if lo > 0:
            s = _scores(q, K, bh, 0, offs_m, offs_n, offs_d, stride_s, seq_k, False, CAUSAL, DESC, BLOCK_N, D)
            for start_n in tl.range(BLOCK_N, lo, BLOCK_N):
                s_next = _scores(q, K, bh, start_n, offs_m, offs_n, offs_d, stride_s, seq_k, False, CAUSAL, DESC,
                                 BLOCK_N, D)
                acc, l_i, m_i = _update(acc, l_i, m_i, s, V, bh, start_n - BLOCK_N, offs_n, offs_d, stride_s, seq_k,
                                        qk_scale, False, DESC, SCALED, BLOCK_N, D)
                s = s_next
            acc, l_i, m_i = _update(acc, l_i, m_i, s, V, bh, lo - BLOCK_N, offs_n, offs_d, stride_s, seq_k, qk_scale,
                                    False, DESC, SCALED, BLOCK_N, D)
    else:
        for start_n in tl.range(0, lo, BLOCK_N, warp_specialize=WS):
            acc, l_i, m_i = _step(acc, l_i, m_i, q, K, V, bh, start_n, offs_m, offs_n, offs_d, stride_s, seq_k,
                                  qk_scale, False, CAUSAL, DESC, SCALED, BLOCK_N, D)
    for start_n in tl.range(lo, hi, BLOCK_N):
        acc, l_i, m_i = _step(acc, l_i, m_i, q, K, V, bh, start_n, offs_m, offs_n, offs_d, stride_s, seq_k, qk_scale,
                              True, CAUSAL, DESC, SCALED, BLOCK_N, D)
    y = acc / l_i[:, None]
    tl.store(Y + base_q + offs_m[:, None].to(tl.int64) * stride_s + offs_d[None, :], y.to(Y.dtype.element_ty),
             mask=row_ok[:, None])


def probe(q, k, v, y, causal: bool, cfg: tuple[int, int, int, int], desc: int, ws: bool, scaled: int,
          pipe: bool = False, head_major: bool = True) -> None:
    b, h, sq, d = q.shape
    sk = k.shape[2]
    bm, bn, warps, stages = cfg
    if desc == 2:
        kd = TensorDescriptor(k.view(b * h * sk, d), [b * h * sk, d], [d, 1], [bn, d])
        vd = TensorDescriptor(v.view(b * h * sk, d), [b * h * sk, d], [d, 1], [bn, d])
    elif desc == 3:
        kd = TensorDescriptor(k.view(b * h, sk, d), [b * h, sk, d], [sk * d, d, 1], [1, bn, d])
        vd = TensorDescriptor(v.view(b * h, sk, d), [b * h, sk, d], [sk * d, d, 1], [1, bn, d])
    else:
        kd, vd = k, v
    kw = {} if SMOKE else {"num_stages": stages}
    LAST[0] = _probe_fwd[(triton.cdiv(sq, bm) * b * h,)](
        q, kd, vd, y, d, sq, sk, b * h, float(LOG2E / d**0.5),
        D=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, DESC=desc, WS=ws, SCALED=scaled, PIPE=pipe, HEAD_MAJOR=head_major, num_warps=warps, **kw)


def rel_err(y: torch.Tensor, q, k, v, causal: bool) -> float:
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    return float((y.double() - ref).norm() / ref.norm())


def bench_ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=50, rep=300))


def variants() -> list[tuple[tuple[int, int, int, int], tuple]]:
    """(config, (desc, ws, scaled, pipe, head_major)). Runs a and b (bench/results/attention_probe_h200_s24{a,b}.md)
    put every variant within 0.55-0.65x sdpa, all with a query block of every head side by side (each
    program then streamed its head's keys and values from DRAM); run c: the programs head-major."""
    out = []
    for hm in (False, True):
        out.append(((128, 64, 8, 3), (0, False, 0, False, hm)))
    for cfg in ((128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (128, 64, 4, 3), (64, 64, 4, 3)):
        out.append((cfg, (3, False, 0, False, True)))
    out += [((128, 128, 8, 3), (3, False, 1, False, True)), ((128, 64, 8, 3), (3, True, 0, False, True)),
            ((128, 128, 8, 3), (3, True, 1, False, True))]
    return out


def main() -> int:
    if SMOKE:
        shape, dtype = (1, 2, 200, 32), torch.float32
    else:
        shape, dtype = (4, 32, 4096, 128), torch.bfloat16
    b, h, s, d = shape
    g = torch.Generator(device=DEV).manual_seed(7)
    q, k, v = (torch.randn(b, h, s, d, device=DEV, generator=g).to(dtype) for _ in range(3))
    y = torch.empty_like(q)
    say(f"# attention probe {list(shape)} {str(dtype).removeprefix('torch.')} "
        f"({torch.cuda.get_device_name() if not SMOKE else 'cpu, interpreter'}, triton {triton.__version__}, "
        f"{time.strftime('%Y-%m-%d')})\n")
    say("| causal | variant | BLOCK_M | BLOCK_N | warps | stages | rel err | ms | TFLOP/s | sdpa time / this | regs / spills |")
    say("|---|---|---|---|---|---|---|---|---|---|---|")
    bad = 0
    for causal in (False, True):
        fl = attention_flops(b, h, s, s, d, causal)
        t_sdpa = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)) if not SMOKE else 1.0
        say(f"| {int(causal)} | torch sdpa | | | | | | {t_sdpa:.3f} | {fl / t_sdpa / 1e9:.1f} | 1.00 |")
        rows = [("optwin default, stop 23's order", default_config(dtype, d, causal), False),
                ("optwin default", default_config(dtype, d, causal), None), ("optwin", (128, 128, 8, 3), None)]
        for cfg, opts in variants():
            rows.append(("desc={} ws={:d} scaled={} pipe={:d} head-major={:d}".format(*opts), cfg, opts))
        for name, cfg, opts in rows:
            if SMOKE:
                cfg = (64, 32, cfg[2], cfg[3])
            try:
                if opts is None or opts is False:  # the production kernel (False: the program order before stop 24)
                    fn = lambda: attention(q, k, v, causal, sketch=False, out=y, config=cfg,  # noqa: E731
                                           _head_major=opts is None)
                else:
                    fn = lambda: probe(q, k, v, y, causal, cfg, *opts)  # noqa: E731
                y.fill_(float("nan"))
                fn()
                err = rel_err(y, q, k, v, causal)
                t = bench_ms(fn) if not SMOKE else 1.0
            except Exception as e:  # noqa: BLE001 - a variant that does not compile: report, go on
                bad += SMOKE  # on the GPU a config can outgrow shared memory; in the interpreter nothing may fail
                say(f"| {int(causal)} | {name} | {cfg[0]} | {cfg[1]} | {cfg[2]} | {cfg[3]} | {type(e).__name__}: "
                    f"{str(e).splitlines()[0][:90] if str(e) else ''} | | | |")
                continue
            kern = LAST[0] if opts else None
            regs = f"{getattr(kern, 'n_regs', '?')} / {getattr(kern, 'n_spills', '?')}" if kern is not None else ""
            ok = err < (1e-5 if dtype == torch.float32 else 2e-2)
            bad += not ok
            say(f"| {int(causal)} | {name} | {cfg[0]} | {cfg[1]} | {cfg[2]} | {cfg[3]} | {err:.2e}{'' if ok else ' BAD'} | "
                f"{t:.3f} | {fl / t / 1e9:.1f} | {t_sdpa / t:.2f} | {regs} |")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "attention_probe.md").write_text("\n".join(LINES) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
