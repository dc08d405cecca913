"""rmsnorm twin: fp32-acc (LlamaRMSNorm), native-dtype (T5LayerNorm without upcast), triton.

Inputs are float64 views of dtype tensors, `x (..., hidden)`, `weight (hidden,)`, possibly with a
leading replay dim. Each `num.round` below is one rounding of the GPU code.
"""

from __future__ import annotations

import torch

from optwin.catalog import CATALOG
from optwin.twin.numerics import Numerics, scalar32
from optwin.twin.triton_reduce import row_sum_squares

EPS = CATALOG["rmsnorm"].constants["eps"]
EPS32 = scalar32(EPS)  # `v + eps` adds eps cast to float32: torch's float32 (opmath) add, Triton's fp32 argument
F32 = "float32"


def reference(inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    x, w = inputs["x"], inputs["weight"]
    return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS))


def twin(num: Numerics, variant: str, dtype: str, inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    x = inputs["x"]  # (..., hidden)
    w = num.align(inputs["weight"], like=x)  # (hidden,)
    if variant == "fp32-acc":
        h = x  # x.float() is exact
        v = num.mean(num.round(h * h, F32), keepdim=True)  # CUDA reduce, fp32 accumulator
        r = num.round(torch.rsqrt(num.round(v + EPS32, F32)), F32)
        hn = num.round(num.round(h * r, F32), dtype)  # (h * rsqrt(...)).to(dtype)
        return num.round(w * hn, dtype)  # weight * (...) in dtype
    if variant == "native-dtype":
        sq = num.round(x * x, dtype)  # x*x in dtype: |x| > 256 overflows float16
        # mean accumulates fp32, result in dtype; torch's reduce reads the dtype tensor in 16-byte vectors
        v = num.round(num.mean(sq, keepdim=True, itemsize=getattr(torch, dtype).itemsize), dtype)
        # v + eps: a dtype tensor and a Python scalar add in float32 (opmath), then round to dtype
        r = num.round(torch.rsqrt(num.round(num.round(v + EPS32, F32), dtype)), dtype)
        return num.round(w * num.round(x * r, dtype), dtype)
    if variant == "triton":
        # held whole: FMA-folded neighbours, then one tl.sum in the kernel's layout; longer: per-lane sums over the
        # kernel's chunks, then a tree
        v = num.round(row_sum_squares(num, x, dtype, "rmsnorm") / x.shape[-1], F32)
        r = num.round(torch.rsqrt(num.round(v + EPS32, F32)), F32)
        y = num.round(num.round(x * r, F32) * w, F32)
        return num.round(y, dtype)
    raise ValueError(f"rmsnorm: no twin for variant {variant!r}")
