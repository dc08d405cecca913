"""Mismatch reports for kernel outputs against a float64 reference (tests and bench/gpu_kernels.py).

    python -c "import torch; from optwin.kernels.compare import mismatch_report; \
print(mismatch_report(torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0], dtype=torch.float64), 1e-3, 1e-3))"

Pure torch. A report says how many elements differ, the first few indices, NaN/±Inf separately
from finite misses, and the worst error in bits (log2 of the error in units of the last place of the
output dtype at the reference value).
"""

from __future__ import annotations

import math

import torch

_MANTISSA = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}


def ulp_bits(got: torch.Tensor, want: torch.Tensor) -> float:
    """Worst log2(|got - want| / ulp(want)) over finite pairs, ulp in got's dtype; 0 if exact."""
    mant = _MANTISSA.get(got.dtype, 52)
    g, w = got.double(), want.double()
    both = torch.isfinite(g) & torch.isfinite(w)
    if not both.any():
        return 0.0
    exp = torch.floor(torch.log2(w[both].abs().clamp(min=2.0**-126)))  # exponent of the reference
    ulp = torch.pow(2.0, exp - mant)
    err = ((g[both] - w[both]).abs() / ulp).max().item()
    return math.log2(err) if err > 0 else 0.0


def mismatch_report(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float, first: int = 5) -> str | None:
    """None when every element is within atol + rtol*|want| (NaN/±Inf must match exactly), else one
    line: count of misses, first indices, NaN/±Inf counts, worst error in bits."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != expected {tuple(want.shape)}"
    g, w = got.detach().double().cpu(), want.detach().double().cpu()
    nan_bad = torch.isnan(g) != torch.isnan(w)
    inf_bad = (torch.isinf(g) | torch.isinf(w)) & (g != w) & ~torch.isnan(g) & ~torch.isnan(w)
    fin = torch.isfinite(g) & torch.isfinite(w)
    far = fin & ((g - w).abs() > atol + rtol * w.abs())
    bad = nan_bad | inf_bad | far
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None
    idx = [tuple(int(i) for i in ix) for ix in bad.nonzero()[:first]]
    worst = (g - w).abs()[far].max().item() if far.any() else 0.0
    return (
        f"{n_bad}/{g.numel()} elements differ (atol={atol:g}, rtol={rtol:g}); first at {idx}; "
        f"NaN mismatches {int(nan_bad.sum())}, ±Inf mismatches {int(inf_bad.sum())}, "
        f"finite misses {int(far.sum())} (worst abs {worst:.3g}, {ulp_bits(got, want):.1f} bits)"
    )
