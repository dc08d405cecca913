"""attention twin: sdpa (flash-style fp32 scores and softmax), math (HF eager, every step in dtype) and
triton (our flash kernel, optwin.kernels.attention: online softmax per key block of BLOCK_N).

    python -c "import torch; from optwin import twin; q = torch.full((1, 1, 4, 64), 40.).half(); \
print(twin.run('attention', 'math', 'float16', {'q': q, 'k': q, 'v': q}).faults)"

Inputs `q (b, h, sq, d)`, `k (b, h, sk, d)`, `v (b, h, sk, dv)` are float64 views of dtype tensors
and may carry a leading replay dim. The causal mask is top-left aligned as sdpa's `is_causal`
(query i sees keys j <= i), so every row keeps key 0 and no row is ever fully masked, whatever
sq and sk are (checked against torch CPU sdpa, which gives finite outputs for sq > sk).
"""

from __future__ import annotations

import math

import torch

from optwin.twin.numerics import Numerics, round_nearest
from optwin.twin.softmax import torch_softmax

F32 = "float32"


def causal_mask(sq: int, sk: int) -> torch.Tensor:
    """True where query i must not see key j (j > i): sdpa's is_causal, top-left aligned."""
    return torch.ones(sq, sk, dtype=torch.bool).triu(1)  # (sq, sk)


def _scores64(inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    q, k = inputs["q"], inputs["k"]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (b, h, sq, sk) float64
    if params.get("causal"):
        s = s.masked_fill(causal_mask(s.shape[-2], s.shape[-1]), -math.inf)
    return s


def reference_probabilities(inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    """The float64 attention weights P (b, h, sq, sk)."""
    return torch.softmax(_scores64(inputs, params), dim=-1)


def reference(inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v in float64."""
    return reference_probabilities(inputs, params) @ inputs["v"]  # (b, h, sq, dv)


def _scale32(d: int) -> float:
    """1/sqrt(d) as the kernel sees it: a Python double passed to fp32 (opmath) arithmetic."""
    return float(round_nearest(torch.tensor(1.0 / math.sqrt(d), dtype=torch.float64), F32))


def sdpa(num: Numerics, dtype: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Flash attention modelled with a global row max: fp32 scores and softmax; P rounded to dtype
    for the second MMA (fp32 inputs keep fp32 P); o / l in fp32; one store in dtype."""
    s = num.matmul(q, k.transpose(-1, -2), out=F32, acc=F32)  # (..., sq, sk) fp32 MMA
    s = num.round(s * _scale32(q.shape[-1]), F32)  # (..., sq, sk) fp32
    if causal:
        s = s.masked_fill(causal_mask(s.shape[-2], s.shape[-1]), -math.inf)
    m = num.max(s, keepdim=True)  # (..., sq, 1) exact
    e = num.round(torch.exp(num.round(s - m, F32)), F32)  # (..., sq, sk) fp32
    l = num.sum(e, acc=F32, order="blocked", keepdim=True)  # (..., sq, 1) fp32 row sum
    p = e if dtype == F32 else num.round(e, dtype)  # (..., sq, sk) P cast for the P@V MMA
    o = num.matmul(p, v, out=F32, acc=F32)  # (..., sq, dv) fp32 accumulator
    y = num.round(o / l, F32)  # (..., sq, dv) fp32 epilogue
    return y if dtype == F32 else num.round(y, dtype)


def eager(num: Numerics, dtype: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """HF eager attention: scores, scaling, softmax and output each a dtype tensor."""
    s = num.matmul(q, k.transpose(-1, -2), out=dtype, acc=F32)  # (..., sq, sk) dtype: may overflow
    s = num.round(s * _scale32(q.shape[-1]), dtype)  # (..., sq, sk) dtype, fp32 opmath product
    if causal:
        s = s.masked_fill(causal_mask(s.shape[-2], s.shape[-1]), -math.inf)
    p = torch_softmax(num, s, dtype)  # (..., sq, sk) dtype: torch.softmax semantics
    return num.matmul(p, v, out=dtype, acc=F32)  # (..., sq, dv) dtype


# Keys per block of our Triton kernel (optwin.kernels.attention reads it from here): the online
# softmax rescales once per key block, so BLOCK_N is part of the numerics; BLOCK_M is not.
TRITON_BLOCK_N = {"float16": 64, "bfloat16": 64, "float32": 32}
LOG2E = 1.4426950408889634


def triton_block_n(dtype: str, d: int) -> int:
    """BLOCK_N of optwin.kernels.attention for (dtype, head dim d)."""
    return TRITON_BLOCK_N[dtype]


def triton_qk_scale(d: int) -> float:
    """log2(e)/sqrt(d) as the kernel gets it: a double product passed as an fp32 scalar."""
    return float(round_nearest(torch.tensor(LOG2E / math.sqrt(d), dtype=torch.float64), F32))


def triton_flash(num: Numerics, dtype: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Our Triton flash kernel, key block by key block (BLOCK_N keys, starting at key 0):
        x = fp32(dot(q, k^T)) * c            c = fp32(log2(e)/sqrt(d)): base-2 scores
        m' = max(m, rowmax(x)); a = exp2(m - m'); p = exp2(x - m')   (ex2.approx: modelled as exp2
                                                                    rounded to fp32; the GPU may fuse
                                                                    x*c - m' into one FMA)
        l = l*a + tree-sum(p); acc = acc*a + dot(p.to(dtype), v)     (fp32 accumulator)
        y = (acc / l).to(dtype)              one rounding to dtype
    Masked keys (causal, top-left aligned) are -inf, so p = 0 there; m starts at -inf, a = 0."""
    bn = triton_block_n(dtype, q.shape[-1])
    s = num.matmul(q, k.transpose(-1, -2), out=F32, acc=F32)  # (..., sq, sk) fp32 MMA
    x = num.round(s * triton_qk_scale(q.shape[-1]), F32)  # (..., sq, sk) fp32, base-2 units
    if causal:
        x = x.masked_fill(causal_mask(x.shape[-2], x.shape[-1]), -math.inf)
    m = torch.full_like(x[..., :1], -math.inf)  # (..., sq, 1) running max
    l = torch.zeros_like(m)  # (..., sq, 1) running sum
    acc = None
    for j in range(0, x.shape[-1], bn):
        xj = x[..., j:j + bn]  # (..., sq, bn)
        m_new = torch.maximum(m, num.max(xj, keepdim=True))  # exact
        a = num.round(torch.exp2(num.round(m - m_new, F32)), F32)  # (..., sq, 1); 0 on the first block
        p = num.round(torch.exp2(num.round(xj - m_new, F32)), F32)  # (..., sq, bn); 0 where masked
        l = num.round(num.round(l * a, F32) + num.sum(p, acc=F32, order="pairwise", keepdim=True), F32)
        pv = num.matmul(p if dtype == F32 else num.round(p, dtype), v[..., j:j + bn, :], out=F32, acc=F32)
        acc = pv if acc is None else num.round(num.round(acc * a, F32) + pv, F32)  # (..., sq, dv)
        m = m_new
    y = num.round(acc / l, F32)  # (..., sq, dv) fp32 division
    return y if dtype == F32 else num.round(y, dtype)


def twin(num: Numerics, variant: str, dtype: str, inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    causal = bool(params.get("causal", False))
    if variant == "sdpa":
        return sdpa(num, dtype, q, k, v, causal)
    if variant == "math":
        return eager(num, dtype, q, k, v, causal)
    if variant == "triton":
        return triton_flash(num, dtype, q, k, v, causal)
    raise ValueError(f"attention: no twin for variant {variant!r}")
