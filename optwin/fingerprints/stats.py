"""Binomial confidence intervals for fault probabilities.

    python -c "from optwin.fingerprints.stats import wilson; print(wilson(3, 40))"

A fingerprint's probability is k faulting replays out of n. The Wilson score interval stays inside
[0, 1] and behaves at k = 0 and k = n (where the normal interval collapses to a point), which is
exactly where most regions sit: never faulting or always faulting.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (lo, hi) for k successes in n trials; (0, 1) when n == 0.

    Clamped so that lo <= k/n <= hi holds exactly despite rounding (the SQL in aggregate.py does
    the same, so both agree to the last bit up to float evaluation order).
    """
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2.0 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom
    lo = 0.0 if k <= 0 else min(max(0.0, center - half), p)
    hi = 1.0 if k >= n else max(min(1.0, center + half), p)
    return lo, hi


def wilson_sql(k: str, n: str, z: float = Z95) -> tuple[str, str]:
    """SQL expressions (lo, hi) of `wilson` over integer columns/expressions k and n (n > 0)."""
    p = f"(({k})::DOUBLE / ({n}))"
    z2 = repr(z * z)
    denom = f"(1.0 + {z2} / ({n}))"
    center = f"(({p} + {z2} / (2.0 * ({n}))) / {denom})"
    half = f"({z!r} * sqrt({p} * (1.0 - {p}) / ({n}) + {z2} / (4.0 * ({n}) * ({n}))) / {denom})"
    lo = f"(CASE WHEN ({k}) <= 0 THEN 0.0 ELSE least(greatest(0.0, {center} - {half}), {p}) END)"
    hi = f"(CASE WHEN ({k}) >= ({n}) THEN 1.0 ELSE greatest(least(1.0, {center} + {half}), {p}) END)"
    return lo, hi
