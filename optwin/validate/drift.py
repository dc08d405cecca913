"""Drift traces: operator inputs that grow, call after call, into a fault region, each with a flat control.

    python -c "from optwin.validate.drift import TRACES, trace_inputs; \
print([(s.name, s.op, s.dtype) for s in TRACES]); print(trace_inputs(TRACES[0], 'drift', 0)[0]['x'].abs().max())"

A trace is a stream of calls of one operator at a fixed call rate (RATE_HZ, simulated time
t = i / RATE_HZ). The `drift` kind moves one fault-driving quantity geometrically from a safe start
to past a fault boundary (so the matcher's stream sees a steady trend in log space, as a slowly
diverging model would give it); the `flat` kind stays at the start level with fresh noise every call,
and measures false alarms. The traces:

- ``rmsnorm-activations`` (float16): activations |x| from 4 to 4000: native-dtype's x*x overflows
  float16 once |x| passes 256.
- ``softmax-logits`` (float16): the largest logit from 1 to 40 with a fixed spread: the naive
  variant's exp overflows float16 past 11.09.
- ``rope-positions`` (float16): a 16-token window decoding at positions from 1 to 2^22: angles
  lose precision as positions grow (low-precision-angles early, fp32 angles past ~2^17).
- ``geodesic-converging`` (float32): 64 point pairs whose separations shrink from 90 to 1e-3 degrees:
  the law of cosines cancels for near-identical points.

Only torch is imported: the traces are generated on the GPU machine.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from optwin.validate.families import SEED_OFFSET, destination, to_dtype

RATE_HZ = 20.0
CALLS = 200
KINDS: tuple[str, ...] = ("drift", "flat")
F64 = torch.float64

Inputs = tuple[dict[str, torch.Tensor], dict[str, Any]]


@dataclass(frozen=True)
class TraceSpec:
    """One drift trace: `make(g, base, u, dtype)` builds call inputs at progress u in [0, 1]
    (u = 0 for every call of the flat control); `base` is the trace's fixed random pattern."""

    name: str
    op: str
    dtype: str
    make: Callable[[torch.Generator, torch.Tensor, float, str], Inputs]
    base_shape: tuple[int, ...]
    what: str  # what drifts, for the report


def _geo(lo: float, hi: float, u: float) -> float:
    """Geometric interpolation: lo at u = 0, hi at u = 1."""
    return lo * (hi / lo) ** u


def _jitter(g: torch.Generator, base: torch.Tensor, rel: float = 0.05) -> torch.Tensor:
    """The fixed pattern with fresh relative noise: the same activations, a new token."""
    return base * (1.0 + rel * torch.randn(base.shape, generator=g, dtype=F64))


def _rmsnorm(g: torch.Generator, base: torch.Tensor, u: float, dtype: str) -> Inputs:
    x = _jitter(g, base)  # (8, 256)
    x = x * (_geo(4.0, 4000.0, u) / x.abs().max())
    w = torch.ones(base.shape[-1], dtype=F64)
    return {"x": to_dtype(x, dtype), "weight": to_dtype(w, dtype)}, {}


def _softmax(g: torch.Generator, base: torch.Tensor, u: float, dtype: str) -> Inputs:
    z = _jitter(g, base)  # (8, 128)
    z = (z - z.max(-1, keepdim=True).values) * (3.0 / (z.max() - z.min()))  # row ranges <= 3
    return {"x": to_dtype(z + _geo(1.0, 40.0, u), dtype)}, {}


def _rope(g: torch.Generator, base: torch.Tensor, u: float, dtype: str) -> Inputs:
    x = _jitter(g, base)  # (16, 4, 64)
    start = int(round(_geo(1.0, 2.0**22, u)))
    pos = torch.arange(start, start + base.shape[0], dtype=torch.int64)  # (16,)
    return {"x": to_dtype(x, dtype), "positions": pos}, {"base": 10000.0}


def _geodesic(g: torch.Generator, base: torch.Tensor, u: float, dtype: str) -> Inputs:
    n = base.shape[0]
    lat1 = torch.rad2deg(torch.asin(base.clamp(-0.9, 0.9)))  # (n,) fixed start points
    lon1 = torch.rand(n, generator=g, dtype=F64) * 360.0 - 180.0
    sep = _geo(90.0, 1e-3, u) * (1.0 + torch.rand(n, generator=g, dtype=F64))  # (n,) degrees
    lat2, lon2 = destination(lat1, lon1, sep, torch.rand(n, generator=g, dtype=F64) * 2 * math.pi)
    f = lambda a: a.to(torch.float32)  # noqa: E731
    return {"lat1": f(lat1), "lon1": f(lon1), "lat2": f(lat2), "lon2": f(lon2)}, {}


TRACES: tuple[TraceSpec, ...] = (
    TraceSpec("rmsnorm-activations", "rmsnorm", "float16", _rmsnorm, (8, 256), "|x| 4 -> 4000"),
    TraceSpec("softmax-logits", "softmax", "float16", _softmax, (8, 128), "max logit 1 -> 40"),
    TraceSpec("rope-positions", "rope", "float16", _rope, (16, 4, 64), "position 1 -> 2^22"),
    TraceSpec("geodesic-converging", "geodesic", "float32", _geodesic, (64,), "separation 90 -> 1e-3 deg"),
)


def trace_spec(name: str) -> TraceSpec:
    for s in TRACES:
        if s.name == name:
            return s
    raise ValueError(f"unknown drift trace {name!r}; expected one of {', '.join(s.name for s in TRACES)}")


def trace_generator(spec: TraceSpec, kind: str, seed: int) -> tuple[torch.Generator, torch.Tensor]:
    """The call-noise generator of (trace, kind) and the trace's fixed base pattern (shared by kinds)."""
    key = zlib.crc32(spec.name.encode())
    base_g = torch.Generator().manual_seed(SEED_OFFSET + 7 * int(seed) + key)
    base = torch.randn(spec.base_shape, generator=base_g, dtype=F64)
    g = torch.Generator().manual_seed(SEED_OFFSET + 7 * int(seed) + key + 1 + KINDS.index(kind))
    return g, base


def trace_inputs(spec: TraceSpec, kind: str, seed: int = 0, calls: int = CALLS) -> list[Inputs]:
    """Every call's (inputs, params) of one trace, in call order (CPU tensors in the trace's dtype)."""
    if kind not in KINDS:
        raise ValueError(f"unknown trace kind {kind!r}; expected one of {', '.join(KINDS)}")
    g, base = trace_generator(spec, kind, seed)
    out = []
    for i in range(calls):
        u = i / max(calls - 1, 1) if kind == "drift" else 0.0
        out.append(spec.make(g, base, u, spec.dtype))
    return out


def call_times(calls: int = CALLS, rate_hz: float = RATE_HZ) -> list[float]:
    """Simulated seconds of each call at the fixed call rate."""
    return [i / rate_hz for i in range(calls)]
