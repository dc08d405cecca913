"""Production operator variants as plain torch, written exactly as spec/operators.md writes them.

    python -c "import torch; from optwin.kernels.production import run_variant; \
print(run_variant('softmax', 'naive', 'float16', {'x': torch.randn(2, 8).half()}))"

These are the functions the GPU runs in validations: on CUDA tensors they *are* the production
numerics (torch CUDA semantics), on CPU they run the same code under torch's CPU kernels. Every
variant takes its inputs in the variant's dtype and returns the op's output dtype on the inputs'
device. `run_variant` dispatches by catalog name; the variant "triton" goes to our own kernels
(imported lazily, so this module works without triton installed).

The float64 references live in optwin.twin, not here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from optwin.catalog import check_variant_dtype, operator, resolve_params
from optwin.errors import CatalogError, InputError

Tensor = torch.Tensor


# ---------------------------------------------------------------- rmsnorm (eps = catalog constant)


def rmsnorm_fp32_acc(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """LlamaRMSNorm: statistics in float32, normalised value rounded to dtype, weight product in dtype."""
    h = x.float()  # (..., hidden) fp32
    v = h.pow(2).mean(-1, keepdim=True)  # (..., 1) fp32
    return weight * (h * torch.rsqrt(v + eps)).to(x.dtype)  # (..., hidden) dtype


def rmsnorm_native_dtype(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """T5LayerNorm without upcast: every intermediate is a tensor of x's dtype."""
    v = (x * x).mean(-1, keepdim=True)  # (..., 1) dtype; mean accumulates fp32, rounds once
    return weight * (x * torch.rsqrt(v + eps))  # (..., hidden) dtype, each op rounded


# ---------------------------------------------------------------- softmax


def softmax_torch(x: Tensor) -> Tensor:
    """torch.softmax: float32 internally, max subtracted, rounded to dtype once."""
    return torch.softmax(x, -1)


def softmax_naive(x: Tensor) -> Tensor:
    """exp without max subtraction, every intermediate in dtype (overflows where exp(x) does)."""
    e = torch.exp(x)  # (..., n) dtype
    return e / e.sum(-1, keepdim=True)  # (..., n) dtype; sum fp32-accumulated, rounded to dtype


# ---------------------------------------------------------------- rope


def rope_inv_freq(d: int, base: float, device: torch.device | str) -> Tensor:
    """inv = 1 / base ** (arange(0, d, 2) / d), computed in float32 as the spec writes it."""
    return 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))  # (d/2,) fp32


def rotate_half(x: Tensor) -> Tensor:
    """cat(-x[..., d/2:], x[..., :d/2])."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope_apply(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """y = x * cos + rotate_half(x) * sin in x's dtype; cos/sin are (seq, d) in x's dtype."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]  # (seq, heads, d)


def rope_fp32_angles(x: Tensor, positions: Tensor, base: float) -> Tensor:
    """Angles, cos and sin in float32, cast to dtype, combined in dtype."""
    d = x.shape[-1]
    inv = rope_inv_freq(d, base, x.device)  # (d/2,) fp32
    ang = positions.to(torch.float32)[:, None] * inv[None, :]  # (seq, d/2) fp32
    emb = torch.cat((ang, ang), dim=-1)  # (seq, d) fp32
    return _rope_apply(x, emb.cos().to(x.dtype), emb.sin().to(x.dtype))


def rope_low_precision_angles(x: Tensor, positions: Tensor, base: float) -> Tensor:
    """Positions and inv cast to dtype first; angles, cos and sin computed in dtype."""
    d = x.shape[-1]
    inv = rope_inv_freq(d, base, x.device).to(x.dtype)  # (d/2,) dtype
    ang = positions.to(x.dtype)[:, None] * inv[None, :]  # (seq, d/2) dtype
    emb = torch.cat((ang, ang), dim=-1)  # (seq, d) dtype
    return _rope_apply(x, emb.cos(), emb.sin())


# ---------------------------------------------------------------- attention


def attention_sdpa(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    """torch's scaled_dot_product_attention with its default backend for the device."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B, H, Sq, D)


def causal_mask(seq_q: int, seq_k: int, device: torch.device | str) -> Tensor:
    """True above the diagonal (top-left aligned, as sdpa's is_causal)."""
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).triu(1)  # (Sq, Sk)


def attention_math(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    """HF eager attention: scores, scaling, softmax and output each in dtype."""
    d = q.shape[-1]
    s = q @ k.transpose(-1, -2)  # (B, H, Sq, Sk) dtype, fp32 accumulation
    s = s * (1.0 / math.sqrt(d))  # (B, H, Sq, Sk) dtype
    if causal:
        s = s.masked_fill(causal_mask(s.shape[-2], s.shape[-1], s.device), float("-inf"))
    p = torch.softmax(s, -1)  # (B, H, Sq, Sk) dtype (fp32 internally, rounded once)
    return p @ v  # (B, H, Sq, D) dtype


# ---------------------------------------------------------------- layernorm (eps = catalog constant)


def layernorm_torch(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """F.layer_norm: float32 Welford statistics, rounded to dtype once."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def layernorm_one_pass(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """var = E[h^2] - E[h]^2 in float32 (cancels catastrophically when |mean| >> std)."""
    h = x.float()  # (..., hidden) fp32
    m = h.mean(-1, keepdim=True)  # (..., 1) fp32
    var = (h * h).mean(-1, keepdim=True) - m * m  # (..., 1) fp32, may go negative
    y = (h - m) * torch.rsqrt(var + eps) * weight.float() + bias.float()  # (..., hidden) fp32
    return y.to(x.dtype)


# ---------------------------------------------------------------- geodesic (float32 only)


def _radians(*degrees: Tensor) -> list[Tensor]:
    """Each angle converted on its own, in float32 (differences are taken in radians)."""
    return [torch.deg2rad(t.to(torch.float32)) for t in degrees]


def geodesic_acos(lat1: Tensor, lon1: Tensor, lat2: Tensor, lon2: Tensor, radius: float) -> Tensor:
    """Spherical law of cosines in float32; no clamp, so c slightly above 1 gives NaN (spec)."""
    p1, l1, p2, l2 = _radians(lat1, lon1, lat2, lon2)  # (n,) fp32 each
    c = torch.sin(p1) * torch.sin(p2) + torch.cos(p1) * torch.cos(p2) * torch.cos(l2 - l1)  # (n,)
    return radius * torch.acos(c)  # (n,) km fp32


def geodesic_haversine(lat1: Tensor, lon1: Tensor, lat2: Tensor, lon2: Tensor, radius: float) -> Tensor:
    """Haversine in float32."""
    p1, l1, p2, l2 = _radians(lat1, lon1, lat2, lon2)  # (n,) fp32 each
    a = torch.sin((p2 - p1) / 2) ** 2 + torch.cos(p1) * torch.cos(p2) * torch.sin((l2 - l1) / 2) ** 2  # (n,)
    return 2 * radius * torch.asin(torch.sqrt(a))  # (n,) km fp32


# ---------------------------------------------------------------- matmul


def matmul_torch(a: Tensor, b: Tensor) -> Tensor:
    """a @ b: cuBLAS on the GPU, fp32 accumulation, output in dtype."""
    return a @ b  # (m, n)


# ---------------------------------------------------------------- dispatch

# (op, variant) -> callable(inputs, params, constants) -> tensor. Inputs are looked up by the
# catalog's input names, so a renamed input fails in one place.
_Runner = Callable[[dict[str, Tensor], dict[str, Any], dict[str, float]], Tensor]

_PRODUCTION: dict[tuple[str, str], _Runner] = {
    ("rmsnorm", "fp32-acc"): lambda i, p, c: rmsnorm_fp32_acc(i["x"], i["weight"], c["eps"]),
    ("rmsnorm", "native-dtype"): lambda i, p, c: rmsnorm_native_dtype(i["x"], i["weight"], c["eps"]),
    ("softmax", "torch"): lambda i, p, c: softmax_torch(i["x"]),
    ("softmax", "naive"): lambda i, p, c: softmax_naive(i["x"]),
    ("rope", "fp32-angles"): lambda i, p, c: rope_fp32_angles(i["x"], i["positions"], float(p["base"])),
    ("rope", "low-precision-angles"): lambda i, p, c: rope_low_precision_angles(
        i["x"], i["positions"], float(p["base"])
    ),
    ("attention", "sdpa"): lambda i, p, c: attention_sdpa(i["q"], i["k"], i["v"], bool(p["causal"])),
    ("attention", "math"): lambda i, p, c: attention_math(i["q"], i["k"], i["v"], bool(p["causal"])),
    ("layernorm", "torch"): lambda i, p, c: layernorm_torch(i["x"], i["weight"], i["bias"], c["eps"]),
    ("layernorm", "one-pass"): lambda i, p, c: layernorm_one_pass(i["x"], i["weight"], i["bias"], c["eps"]),
    ("geodesic", "acos"): lambda i, p, c: geodesic_acos(
        i["lat1"], i["lon1"], i["lat2"], i["lon2"], c["radius_km"]
    ),
    ("geodesic", "haversine"): lambda i, p, c: geodesic_haversine(
        i["lat1"], i["lon1"], i["lat2"], i["lon2"], c["radius_km"]
    ),
    ("matmul", "torch"): lambda i, p, c: matmul_torch(i["a"], i["b"]),
}


def _check_inputs(op: str, dtype: str, inputs: dict[str, Tensor]) -> None:
    """Every catalog input present, a tensor, of the right dtype and rank; nothing extra."""
    spec = operator(op)
    names = spec.input_names()
    missing = [n for n in names if n not in inputs]
    extra = sorted(set(inputs) - set(names))
    if missing or extra:
        raise InputError(f"{op}: expected inputs {list(names)}, missing {missing}, unexpected {extra}")
    for s in spec.inputs:
        t = inputs[s.name]
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{op}: input {s.name!r} must be a torch tensor, got {type(t).__name__}")
        if s.dtype == "int64":
            ok = not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool
            want = "an integer dtype"
        else:
            want = dtype if s.dtype == "op" else s.dtype
            ok = t.dtype == getattr(torch, want)
        if not ok:
            raise InputError(f"{op}: input {s.name!r} has dtype {t.dtype}, expected {want}")
        if t.ndim < s.min_ndim or (s.max_ndim is not None and t.ndim > s.max_ndim):
            raise InputError(f"{op}: input {s.name!r} has shape {tuple(t.shape)}, expected {s.shape}")
    devices = {t.device for t in inputs.values()}
    if len(devices) > 1:
        raise InputError(f"{op}: inputs are on several devices {sorted(map(str, devices))}")


def run_variant(
    op: str,
    variant: str,
    dtype: str,
    inputs: dict[str, Tensor],
    params: dict[str, Any] | None = None,
) -> Tensor:
    """Run one catalog variant on `inputs` (on their device); output in the op's output dtype.

    Unknown op/variant/dtype/param -> CatalogError; wrong inputs -> InputError.
    """
    spec = check_variant_dtype(op, variant, dtype)
    resolved = resolve_params(op, params)
    _check_inputs(op, dtype, inputs)
    if variant == "triton":
        from optwin.kernels.triton_dispatch import run_triton  # lazy: imports triton

        y = run_triton(op, inputs, resolved, dict(spec.constants))
    else:
        runner = _PRODUCTION.get((op, variant))
        if runner is None:  # a catalog variant nobody wrote here yet
            raise CatalogError(f"{op}/{variant}: no production implementation in optwin.kernels")
        y = runner(inputs, resolved, dict(spec.constants))
    return y.to(getattr(torch, spec.out_dtype(dtype)))
