"""Held-out operator inputs for validation: fresh seeds and input families the builds never use.

    python -c "from optwin.validate.families import held_out_cases; \
print([c.family for c in held_out_cases('softmax', 'float16', 6, seed=0)])"

The fingerprint builder draws its cases from optwin.ingest.generate (families normal, heavy,
outlier, uniform; numpy PCG64 streams). A validation that reused them would score the database on
its own training data, so the cases here come from a different generator (torch's Philox/MT
`torch.Generator`, seeds offset by 10**6) and from three families the builder does not have:

- ``mixture``: a two-component Gaussian mixture, most elements N(0, 1), about 10% N(0, s^2) with
  s in 3..30: heavy shoulders without single outlier channels.
- ``sparse-spikes``: nearly all elements tiny (0.01 N(0, 1)) and 1..8 elements of full size: a
  large absmax/rms ratio with the spikes at random positions, not fixed channels.
- ``drifted-scale``: each row's scale grows geometrically down the rows (by 10..1000x overall),
  as activations that drift within one batch.

Each op maps the family onto its fault-driving features (magnitudes, logit ranges, positions,
score bounds, mean/std ratios, point separations, output bounds) drawn log-uniformly over ranges
that cross the dtype's fault boundaries, so the scored set has positives and negatives. Only torch
is imported: this runs on the GPU machine.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from optwin.catalog import CATALOG, check_variant_dtype

SEED_OFFSET = 10**6
HELD_OUT_FAMILIES: tuple[str, ...] = ("mixture", "sparse-spikes", "drifted-scale")
F64 = torch.float64
_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class HeldOutCase:
    """One validation call: CPU inputs in the op's dtype, params, family, and its index."""

    inputs: dict[str, torch.Tensor]
    params: dict[str, Any] = field(default_factory=dict)
    family: str = ""
    index: int = 0


def case_generator(seed: int, op: str, dtype: str, i: int) -> torch.Generator:
    """Independent, reproducible stream per (seed, op, dtype, case), offset by SEED_OFFSET."""
    key = zlib.crc32(f"{op}/{dtype}/{i}".encode())
    return torch.Generator().manual_seed(SEED_OFFSET + int(seed) * 1_000_003 + key)


# ----------------------------------------------------------------------------- random helpers


def _uniform(g: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand((), generator=g, dtype=F64))


def _loguniform(g: torch.Generator, lo: float, hi: float) -> float:
    return math.exp(_uniform(g, math.log(lo), math.log(hi)))


def _randint(g: torch.Generator, lo: int, hi: int) -> int:
    """Integer in [lo, hi] inclusive."""
    return int(torch.randint(lo, hi + 1, (), generator=g))


def _log_int(g: torch.Generator, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(round(_loguniform(g, lo, hi)))))


def _pick(g: torch.Generator, options: tuple[Any, ...]) -> Any:
    return options[_randint(g, 0, len(options) - 1)]


def _normal(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=F64)


def family_values(g: torch.Generator, family: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Float64 values of one held-out family with max |value| = 1 (never all zero)."""
    if family == "mixture":
        z = _normal(g, *shape)
        wide = torch.rand(shape, generator=g, dtype=F64) < 0.1
        z = torch.where(wide, z * _uniform(g, 3.0, 30.0), z)
    elif family == "sparse-spikes":
        z = 0.01 * _normal(g, *shape)
        flat = z.reshape(-1)  # view: spikes land in z
        k = min(flat.numel(), _randint(g, 1, 8))
        idx = torch.randperm(flat.numel(), generator=g)[:k]
        signs = torch.where(torch.rand(k, generator=g, dtype=F64) < 0.5, -1.0, 1.0)
        flat[idx] = signs * (0.5 + 0.5 * torch.rand(k, generator=g, dtype=F64))
    elif family == "drifted-scale":
        z = _normal(g, *shape)
        rows = int(math.prod(shape[:-1])) if len(shape) > 1 else shape[0]
        growth = _loguniform(g, 10.0, 1000.0)
        ramp = growth ** (torch.arange(rows, dtype=F64) / max(rows - 1, 1))  # (rows,)
        z = (z.reshape(rows, -1) * ramp[:, None]).reshape(shape) if len(shape) > 1 else z * ramp
    else:
        raise ValueError(f"unknown held-out family {family!r}; expected one of {', '.join(HELD_OUT_FAMILIES)}")
    m = z.abs().max()
    return z / m if m > 0 else torch.ones(shape, dtype=F64)


def to_dtype(a: torch.Tensor, dtype: str) -> torch.Tensor:
    """Float64 -> dtype, clipped to the finite range (-inf kept: softmax masks)."""
    t = _TORCH_DTYPES[dtype]
    big = torch.finfo(t).max
    return torch.where(a == -math.inf, a, a.clamp(-big, big)).to(t)


# ----------------------------------------------------------------------------- per operator


def _rmsnorm(g: torch.Generator, dtype: str, fam: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    rows, hidden = _log_int(g, 1, 32), _pick(g, (64, 96, 256, 768, 1024))
    hi = 3e3 if dtype == "float16" else 1e22  # fp16 squares overflow past 256; wider dtypes past 1.8e19
    x = family_values(g, fam, (rows, hidden)) * _loguniform(g, 1e-5, hi)  # (rows, hidden)
    w = 1.0 + 0.1 * _normal(g, hidden)  # (hidden,)
    if _uniform(g, 0, 1) < 0.3:
        w = w * _loguniform(g, 0.5, 8.0)
    return {"x": to_dtype(x, dtype), "weight": to_dtype(w, dtype)}, {}


def _softmax(g: torch.Generator, dtype: str, fam: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    rows, n = _log_int(g, 1, 32), _pick(g, (16, 100, 256, 1000))
    z = family_values(g, fam, (rows, n))  # (rows, n) in [-1, 1]
    spread = _loguniform(g, 1e-2, 3e3)
    top = _loguniform(g, 0.1, 3e3) * (1.0 if _uniform(g, 0, 1) < 0.75 else -1.0)
    x = z * spread
    x = x - x.max(-1, keepdim=True).values + top  # every row's max is `top`
    u = _uniform(g, 0, 1)
    if u < 0.25:  # causal-style mask, queries at the end of n keys
        off = max(n - rows, 0)
        mask = torch.arange(n)[None, :] > (torch.arange(rows)[:, None] + off)
        x = x.masked_fill(mask, -math.inf)
    elif u < 0.3:  # one fully masked row: softmax is 0/0
        x[_randint(g, 0, rows - 1)] = -math.inf
    return {"x": to_dtype(x, dtype)}, {}


def _rope(g: torch.Generator, dtype: str, fam: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    seq, heads, d = _log_int(g, 1, 32), _randint(g, 1, 4), _pick(g, (32, 64, 128))
    x = family_values(g, fam, (seq, heads, d)) * _loguniform(g, 1e-2, 1e3)  # (seq, heads, d)
    max_pos = int(_loguniform(g, 1.0, 2.0**25))
    start = max(max_pos - seq + 1, 0)
    positions = torch.arange(start, start + seq, dtype=torch.int64)  # (seq,)
    base = 10000.0 if _uniform(g, 0, 1) < 0.7 else 500000.0
    return {"x": to_dtype(x, dtype), "positions": positions}, {"base": base}


def _attention(g: torch.Generator, dtype: str, fam: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    b, h, d = _randint(g, 1, 2), _randint(g, 1, 4), _pick(g, (32, 64, 128))
    sk = _log_int(g, 1, 128)
    sq = sk if _uniform(g, 0, 1) < 0.6 else 1
    q = family_values(g, fam, (b, h, sq, d))  # (b, h, sq, d)
    k = family_values(g, fam, (b, h, sk, d))  # (b, h, sk, d)
    if _uniform(g, 0, 1) < 0.3:  # some keys along queries: scores reach their bound
        nk = max(1, sk // 8)
        src = q[:, :, torch.randint(0, sq, (nk,), generator=g)]  # (b, h, nk, d)
        k[:, :, torch.randperm(sk, generator=g)[:nk]] = src
    bound = _loguniform(g, 1e-1, 1e6)
    nq, nkk = q.norm(dim=-1).max(), k.norm(dim=-1).max()
    s = math.sqrt(bound * math.sqrt(d) / float(nq * nkk))
    v = _normal(g, b, h, sk, d)
    causal = bool(sq == sk and _uniform(g, 0, 1) < 0.5)
    return {"q": to_dtype(q * s, dtype), "k": to_dtype(k * s, dtype), "v": to_dtype(v, dtype)}, {"causal": causal}


def _layernorm(g: torch.Generator, dtype: str, fam: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    rows, hidden = _log_int(g, 1, 32), _pick(g, (64, 384, 1024))
    z = family_values(g, fam, (rows, hidden))
    z = z - z.mean(-1, keepdim=True)
    sd = z.std(-1, correction=0, keepdim=True)
    z = torch.where(sd > 0, z / torch.where(sd > 0, sd, torch.ones_like(sd)), torch.ones_like(z))
    ratio = _loguniform(g, 1e-1, 1e8)
    amax = _loguniform(g, 1e-1, 1e4 if dtype == "float16" else 1e6)
    sigma = amax / (ratio + z.abs().max())
    x = ratio * sigma + sigma * z  # (rows, hidden): |mean|/std = ratio in every row
    w = 1.0 + 0.2 * _normal(g, hidden)
    bias = 0.1 * _normal(g, hidden)
    return {"x": to_dtype(x, dtype), "weight": to_dtype(w, dtype), "bias": to_dtype(bias, dtype)}, {}


def destination(lat: torch.Tensor, lon: torch.Tensor, sep_deg: torch.Tensor, bearing: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The point at angular distance sep_deg along bearing (radians) from (lat, lon), float64."""
    p1, l1, dl = torch.deg2rad(lat), torch.deg2rad(lon), torch.deg2rad(sep_deg)
    p2 = torch.asin((torch.sin(p1) * torch.cos(dl) + torch.cos(p1) * torch.sin(dl) * torch.cos(bearing)).clamp(-1, 1))
    l2 = l1 + torch.atan2(torch.sin(bearing) * torch.sin(dl) * torch.cos(p1), torch.cos(dl) - torch.sin(p1) * torch.sin(p2))
    return torch.rad2deg(p2), (torch.rad2deg(l2) + 180.0) % 360.0 - 180.0


def _log_sep(g: torch.Generator, n: int, lo: float, hi: float) -> torch.Tensor:
    u = torch.rand(n, generator=g, dtype=F64)
    return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))


def _geodesic(g: torch.Generator, dtype: str, fam: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    n = _log_int(g, 8, 512)
    lo = _loguniform(g, 1e-9, 1.0)  # the smallest separation drives acos' cancellation
    if fam == "mixture":  # near pairs and far pairs mixed
        near = torch.rand(n, generator=g, dtype=F64) < 0.5
        sep = torch.where(near, _log_sep(g, n, lo, lo * 100), _log_sep(g, n, 1.0, 179.0))
    elif fam == "sparse-spikes":  # far pairs with a few near-identical ones
        sep = _log_sep(g, n, 5.0, 179.0)
        k = _randint(g, 1, min(4, n))
        sep[torch.randperm(n, generator=g)[:k]] = _log_sep(g, k, lo, lo * 10)
    else:  # drifted-scale: separations shrink geometrically along the batch
        sep = lo * (min(179.0, lo * 1e6) / lo) ** (torch.arange(n, dtype=F64) / max(n - 1, 1))
    if _uniform(g, 0, 1) < 0.3:  # near (0, 0) float32 degrees resolve 1e-10: tiny separations survive
        lat1 = (torch.rand(n, generator=g, dtype=F64) - 0.5) * 2e-3
        lon1 = (torch.rand(n, generator=g, dtype=F64) - 0.5) * 2e-3
    else:
        lat1 = torch.rad2deg(torch.asin((torch.rand(n, generator=g, dtype=F64) * 2 - 1) * 0.99))
        lon1 = (torch.rand(n, generator=g, dtype=F64) * 2 - 1) * 180.0
    lat2, lon2 = destination(lat1, lon1, sep, torch.rand(n, generator=g, dtype=F64) * 2 * math.pi)
    f = lambda a: a.to(torch.float32)  # noqa: E731  geodesic inputs are float32 degrees
    return {"lat1": f(lat1), "lon1": f(lon1), "lat2": f(lat2), "lon2": f(lon2)}, {}


def _matmul(g: torch.Generator, dtype: str, fam: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    m, k, n = _log_int(g, 1, 256), _log_int(g, 1, 256), _log_int(g, 1, 256)
    a = family_values(g, fam, (m, k))  # (m, k)
    b = family_values(g, "mixture" if fam == "drifted-scale" else fam, (k, n))  # (k, n)
    lo, hi = (1e-9, 1e6) if dtype == "float16" else (1e-40, 1e40)
    bound = _loguniform(g, lo, hi)
    ra, cb = a.norm(dim=1).max(), b.norm(dim=0).max()
    s = math.sqrt(bound / float(ra * cb))
    return {"a": to_dtype(a * s, dtype), "b": to_dtype(b * s, dtype)}, {}


_MAKERS = {"rmsnorm": _rmsnorm, "softmax": _softmax, "rope": _rope, "attention": _attention,
           "layernorm": _layernorm, "geodesic": _geodesic, "matmul": _matmul}


def held_out_case(op: str, dtype: str, i: int, seed: int = 0) -> HeldOutCase:
    """Case i of (op, dtype): family HELD_OUT_FAMILIES[i % 3], its own seeded stream."""
    check_variant_dtype(op, CATALOG[op].variant_names[0] if op in CATALOG else "", dtype)
    fam = HELD_OUT_FAMILIES[i % len(HELD_OUT_FAMILIES)]
    inputs, params = _MAKERS[op](case_generator(seed, op, dtype, i), dtype, fam)
    return HeldOutCase(inputs, params, fam, i)


def held_out_cases(op: str, dtype: str, n: int, seed: int = 0) -> list[HeldOutCase]:
    """n held-out cases of (op, dtype), cycling through the held-out families."""
    return [held_out_case(op, dtype, i, seed) for i in range(n)]
