"""rope twin: fp32-angles (HF Llama), low-precision-angles (tables built in dtype), triton.

    python -c "import torch; from optwin import twin; x = torch.randn(4, 2, 16).half(); \
print(twin.run('rope', 'low-precision-angles', 'float16', {'x': x, 'positions': torch.tensor([0, 1, 70000, 5])}).faults)"

Inputs are float64 views: `x (seq, heads, d)` and `positions (seq,)` (integers held in float64),
possibly with a leading replay dim. Each `num.round` is one rounding of the GPU code. The GPU's
powf/cosf/sinf are not correctly rounded (<= 2 ulp in CUDA's libdevice); the deterministic twin
models them as correctly rounded (float64 result rounded once to float32) and the noise modes
cover the difference.
"""

from __future__ import annotations

import torch

from optwin.twin.numerics import Numerics

F32 = "float32"


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """cat(-x[..., d/2:], x[..., :d/2]): negation and concatenation are exact."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def reference(inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    x, pos = inputs["x"], inputs["positions"]  # (..., seq, heads, d), (..., seq)
    d = x.shape[-1]
    inv = 1.0 / float(params["base"]) ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    ang = pos[..., :, None] * inv  # (..., seq, d/2)
    emb = torch.cat((ang, ang), dim=-1)[..., :, None, :]  # (..., seq, 1, d)
    return x * torch.cos(emb) + rotate_half(x) * torch.sin(emb)


def inv_freq(num: Numerics, d: int, base: float) -> torch.Tensor:
    """1 / base ** (arange(0, d, 2) / d) in float32: the division, the pow and the reciprocal each
    rounded (torch casts the python base to float32 before its float32 pow)."""
    e = num.round(num.expand(torch.arange(0, d, 2, dtype=torch.float64)) / d, F32)  # (R?, d/2)
    b = num.round(torch.tensor(float(base), dtype=torch.float64), F32)
    p = num.round(b ** e, F32)  # powf, modelled correctly rounded
    return num.round(1.0 / p, F32)  # (R?, d/2)


def _combine(num: Numerics, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, f: str) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin with both products and the sum rounded to format f."""
    c, s = cos[..., :, None, :], sin[..., :, None, :]  # (..., seq, 1, d)
    return num.round(num.round(x * c, f) + num.round(rotate_half(x) * s, f), f)


def twin(num: Numerics, variant: str, dtype: str, inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    x, pos = inputs["x"], inputs["positions"]  # (..., seq, heads, d), (..., seq)
    d = x.shape[-1]
    inv = inv_freq(num, d, float(params["base"]))[..., None, :]  # (R?, 1, d/2)
    if variant in ("fp32-angles", "triton"):
        ang = num.round(num.round(pos, F32)[..., :, None] * inv, F32)  # pos.float() * inv  (..., seq, d/2)
        emb = torch.cat((ang, ang), dim=-1)  # (..., seq, d) fp32
        cos = num.round(torch.cos(emb), F32)  # cosf, modelled correctly rounded
        sin = num.round(torch.sin(emb), F32)
        if variant == "triton":  # combine in fp32 registers, one store in dtype
            return num.round(_combine(num, x, cos, sin, F32), dtype)
        return _combine(num, x, num.round(cos, dtype), num.round(sin, dtype), dtype)
    if variant == "low-precision-angles":
        # int64 -> dtype goes through float32 (exact below 2^24); float16 holds integers exactly only
        # up to 2048 and overflows to inf past 65504 (then cos(inf) = NaN).
        pos_d = num.round(num.round(pos, F32), dtype)  # (..., seq)
        inv_d = num.round(inv, dtype)
        ang = num.round(pos_d[..., :, None] * inv_d, dtype)  # (..., seq, d/2) dtype
        emb = torch.cat((ang, ang), dim=-1)  # (..., seq, d)
        # cos/sin of a dtype tensor: upcast, cosf in float32, rounded to dtype.
        cos = num.round(num.round(torch.cos(emb), F32), dtype)
        sin = num.round(num.round(torch.sin(emb), F32), dtype)
        return _combine(num, x, cos, sin, dtype)
    raise ValueError(f"rope: no twin for variant {variant!r}")
