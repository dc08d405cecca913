"""geodesic twin: acos (spherical law of cosines) and haversine, float32 throughout.

    python -c "import torch; from optwin import twin; a = torch.full((8,), 45.0); \
print(twin.run('geodesic', 'acos', 'float32', {'lat1': a, 'lon1': a, 'lat2': a + 1e-5, 'lon2': a}).faults)"

Inputs are float64 views of float32 degrees `lat1, lon1, lat2, lon2 (n,)`, possibly with a leading
replay dim. Each `num.round` is one float32 rounding of the GPU code. The GPU's sinf/cosf/acosf/
asinf are not correctly rounded (<= 1-2 ulp); the deterministic twin models them as correctly
rounded (float64 result rounded once) and the noise modes cover the difference.
"""

from __future__ import annotations

import math

import torch

from optwin.catalog import CATALOG
from optwin.twin.numerics import FORMATS, Numerics, round_nearest

R_KM = CATALOG["geodesic"].constants["radius_km"]
F32 = "float32"


def _f32(v: float) -> float:
    """A python float as torch's float32 kernels see it (wrapped scalars are cast to float32)."""
    return float(round_nearest(torch.tensor(v, dtype=torch.float64), FORMATS[F32]))


DEG2RAD32 = _f32(math.pi / 180.0)  # torch.deg2rad multiplies by pi/180 cast to float32
R32 = _f32(R_KM)  # radius * acos(c)
TWO_R32 = _f32(2.0 * R_KM)  # `2 * radius` is a python product, cast once


def reference(inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    p1, l1, p2, l2 = (torch.deg2rad(inputs[k]) for k in ("lat1", "lon1", "lat2", "lon2"))
    a = torch.sin((p2 - p1) / 2) ** 2 + torch.cos(p1) * torch.cos(p2) * torch.sin((l2 - l1) / 2) ** 2
    return 2.0 * R_KM * torch.asin(torch.sqrt(a))


def twin(num: Numerics, variant: str, dtype: str, inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    def r(t: torch.Tensor) -> torch.Tensor:
        return num.round(t, F32)

    p1, l1, p2, l2 = (r(inputs[k] * DEG2RAD32) for k in ("lat1", "lon1", "lat2", "lon2"))  # (..., n) rad
    if variant == "acos":
        c = r(r(r(torch.sin(p1)) * r(torch.sin(p2)))  # eager torch: each product its own kernel, rounded
              + r(r(r(torch.cos(p1)) * r(torch.cos(p2))) * r(torch.cos(r(l2 - l1)))))
        # Rounding can push c past 1 (acos -> NaN); near-identical points leave c = 1 - tiny and
        # lose the separation to the fp32 spacing at 1.
        return r(R32 * r(torch.acos(c)))
    if variant == "haversine":
        sdp = r(torch.sin(r(r(p2 - p1) / 2)))
        sdl = r(torch.sin(r(r(l2 - l1) / 2)))
        a = r(r(sdp * sdp) + r(r(r(torch.cos(p1)) * r(torch.cos(p2))) * r(sdl * sdl)))  # ** 2 is x*x
        return r(TWO_R32 * r(torch.asin(r(torch.sqrt(a)))))
    raise ValueError(f"geodesic: no twin for variant {variant!r}")
