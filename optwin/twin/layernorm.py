"""layernorm twin: torch (F.layer_norm, fp32 Welford), one-pass (E[h^2] - E[h]^2), triton (two-pass tree,
or Welford over pieces where twin.numerics.welford_chunk says).

    python -c "import torch; from optwin import twin; x = (1e4 + torch.randn(2, 64)).half(); \
print(twin.run('layernorm', 'one-pass', 'float16', {'x': x, 'weight': torch.ones(64).half(), 'bias': torch.zeros(64).half()}).faults)"

Inputs are float64 views of dtype tensors, `x (..., hidden)`, `weight (hidden,)`, `bias (hidden,)`,
possibly with a leading replay dim. Each `num.round` is one rounding of the GPU code. rsqrt is
modelled correctly rounded (CUDA's rsqrtf is within 2 ulp).
"""

from __future__ import annotations

import torch

from optwin.catalog import CATALOG
from optwin.twin.numerics import (
    TRITON_WHOLE_ROW_MAX,
    Numerics,
    fma_odd,
    scalar32,
    sum_squares,
    triton_row_lanes,
    welford_chunk,
)

EPS = CATALOG["layernorm"].constants["eps"]
F32 = "float32"
EPS32 = scalar32(EPS)  # `var + eps` in float32 code adds eps cast to float32


def reference(inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    x, w, b = inputs["x"], inputs["weight"], inputs["bias"]
    m = x.mean(-1, keepdim=True)
    var = ((x - m) ** 2).mean(-1, keepdim=True)  # population variance
    return (x - m) * torch.rsqrt(var + EPS) * w + b


def _normalize(num: Numerics, h: torch.Tensor, m: torch.Tensor, var: torch.Tensor, w: torch.Tensor,
               b: torch.Tensor, fused: bool = False) -> torch.Tensor:
    """((h - m) * rsqrt(var + eps)) * w + b, every operation rounded to float32 (`fused`: the last
    product and the add are one FMA, one rounding)."""
    r = num.round(torch.rsqrt(num.round(var + EPS32, F32)), F32)  # rsqrt(neg) = NaN, as on the GPU
    y = num.round(num.round(h - m, F32) * r, F32)
    return num.round(fma_odd(y, w, b), F32) if fused else num.round(num.round(y * w, F32) + b, F32)


def _lane_constant(num: Numerics, v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """fp32(v) for a per-lane constant v (lanes,), rounded once per replay (under replays it gets the
    replay dim, aligned to broadcast against `like`): a replay's noise never comes from another's."""
    return num.align(num.round(num.expand(v), F32), like=like)


def welford(num: Numerics, h: torch.Tensor, lanes: int = 128, fma_update: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population variance as CUDA's layer_norm computes them: each of `lanes` threads runs
    Welford's update over its strided elements, then a tree of Welford merges; every op in fp32.
    A constant row keeps its mean exactly (every delta is 0), unlike sum / n.
    `fma_update`: the update as our Triton layernorm writes it (1/count rounded once, shared by the
    lanes; mean + delta * (1/count) and m2 + delta * (h - mean) each one FMA, one rounding)."""
    n = h.shape[-1]
    if num.noise == "order" and n > 1:  # a random element order and thread count, as num.sum does
        perm = torch.argsort(num.uniform(h), dim=-1)
        h = torch.gather(h, -1, perm)
        lanes = 2 ** int(torch.randint(5, 11, (1,), generator=num.gen))
    lanes = max(1, min(lanes, n))
    steps = -(-n // lanes)
    valid = torch.arange(steps * lanes).reshape(steps, lanes) < n  # (steps, lanes)
    x = torch.nn.functional.pad(h, (0, steps * lanes - n)).reshape(*h.shape[:-1], steps, lanes)
    mean, m2 = torch.zeros_like(x[..., 0, :]), torch.zeros_like(x[..., 0, :])  # (..., lanes)
    cnt = torch.zeros(lanes, dtype=torch.float64)
    for i in range(steps):
        c = cnt + valid[i]
        delta = num.round(x[..., i, :] - mean, F32)
        if fma_update:  # one rounding each
            new_mean = num.round(fma_odd(delta, _lane_constant(num, 1.0 / c.clamp_min(1), delta), mean), F32)
            new_m2 = num.round(fma_odd(delta, num.round(x[..., i, :] - new_mean, F32), m2), F32)
        else:
            new_mean = num.round(mean + num.round(delta / c.clamp_min(1), F32), F32)
            new_m2 = num.round(m2 + num.round(delta * num.round(x[..., i, :] - new_mean, F32), F32), F32)
        mean, m2 = torch.where(valid[i], new_mean, mean), torch.where(valid[i], new_m2, m2)
        cnt = c
    while mean.shape[-1] > 1:  # tree of merges (warp shuffles, then across warps)
        if mean.shape[-1] % 2:
            mean, m2 = (torch.nn.functional.pad(t, (0, 1)) for t in (mean, m2))
            cnt = torch.nn.functional.pad(cnt, (0, 1))
        half = mean.shape[-1] // 2
        ma, mb, qa, qb, na, nb = mean[..., :half], mean[..., half:], m2[..., :half], m2[..., half:], cnt[:half], cnt[half:]
        nn = na + nb  # counts are exact small integers in fp32
        frac = _lane_constant(num, nb / nn.clamp_min(1), ma)  # (R?, 1.., half)
        delta = num.round(mb - ma, F32)
        mean = num.round(ma + num.round(delta * frac, F32), F32)
        m2 = num.round(num.round(qa + qb, F32) + num.round(num.round(num.round(delta * delta, F32) * na, F32) * frac, F32), F32)
        cnt = nn
    return mean, num.round(m2 / n, F32)  # (..., 1) each


def twin(num: Numerics, variant: str, dtype: str, inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    h = inputs["x"]  # (..., hidden); x.float() is exact
    w = num.align(inputs["weight"], like=h)  # (hidden,)
    b = num.align(inputs["bias"], like=h)
    n = h.shape[-1]
    if variant == "torch":
        m, var = welford(num, h)  # (..., 1) fp32 each
        return num.round(_normalize(num, h, m, var, w, b), dtype)
    if variant == "one-pass":
        m = num.mean(h, keepdim=True)  # (..., 1) fp32
        ms = num.mean(num.round(h * h, F32), keepdim=True)  # E[h^2] fp32
        # E[h^2] - E[h]^2 cancels catastrophically once |mean| / std ~ 2^12 (and can go negative).
        var = num.round(ms - num.round(m * m, F32), F32)
        return num.round(_normalize(num, h, m, var, w, b), dtype)
    if variant == "triton" and welford_chunk(n):
        m, var = welford(num, h, lanes=welford_chunk(n), fma_update=True)
        return num.round(_normalize(num, h, m, var, w, b, fused=True), dtype)
    if variant == "triton":
        # one tl.sum tree per sum, or per-lane sums over the kernel's chunks and then the tree
        lanes = triton_row_lanes(n)
        m = num.round(num.sum(h, order="blocked", lanes=lanes, keepdim=True) / n, F32)
        dev = num.round(h - m, F32)
        var = num.round(sum_squares(num, dev) / n, F32)
        # rows held whole end in an explicit FMA, ((h - m) * r) * w + b with one rounding
        return num.round(_normalize(num, h, m, var, w, b, fused=n <= TRITON_WHOLE_ROW_MAX), dtype)
    raise ValueError(f"layernorm: no twin for variant {variant!r}")
