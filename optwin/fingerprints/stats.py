"""Binomial confidence intervals for fault probabilities.

    python -c "from optwin.fingerprints.stats import wilson; print(wilson(3, 40))"

A fingerprint's probability is k faulting replays out of n. The Wilson score interval stays inside
[0, 1] and behaves at k = 0 and k = n (where the normal interval collapses to a point), which is
exactly where most regions sit: never faulting or always faulting.

The sample is the cases, not the replays: the replays of one case share its input and nearly always
agree (a build review found 590 of 600 cases all-or-nothing), so counting each replay as a trial
shrank a one-case cell's interval by sqrt(replays) (1 case, 8 clean replays: ci_high 0.32, where one
observed input can only say 0.79). `n_eff` is that sample size (schema v3: a cell's n_cases); the
interval is of k / n with n_eff trials, the worst-case design effect of fully agreeing replays.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson(k: int, n: int, z: float = Z95, n_eff: float | None = None) -> tuple[float, float]:
    """The Wilson score interval (lo, hi) for k successes in n trials, as many independent as n_eff (default
    n; a build passes its cell's cases, module docstring); (0, 1) when n == 0.

    Clamped so that lo <= k/n <= hi holds exactly despite rounding (the SQL in aggregate.py does
    the same, so both agree to the last bit up to float evaluation order).
    """
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    m = float(n if n_eff is None else max(n_eff, 1))
    z2 = z * z
    denom = 1.0 + z2 / m
    center = (p + z2 / (2.0 * m)) / denom
    half = z * math.sqrt(p * (1.0 - p) / m + z2 / (4.0 * m * m)) / denom
    lo = 0.0 if k <= 0 else min(max(0.0, center - half), p)
    hi = 1.0 if k >= n else max(min(1.0, center + half), p)
    return lo, hi


def wilson_sql(k: str, n: str, z: float = Z95, n_eff: str | None = None) -> tuple[str, str]:
    """SQL expressions (lo, hi) of `wilson` over integer columns/expressions k, n (n > 0) and n_eff."""
    p = f"(({k})::DOUBLE / ({n}))"
    m = f"greatest(({n if n_eff is None else n_eff})::DOUBLE, 1.0)"
    z2 = repr(z * z)
    denom = f"(1.0 + {z2} / {m})"
    center = f"(({p} + {z2} / (2.0 * {m})) / {denom})"
    half = f"({z!r} * sqrt({p} * (1.0 - {p}) / {m} + {z2} / (4.0 * {m} * {m})) / {denom})"
    lo = f"(CASE WHEN ({k}) <= 0 THEN 0.0 ELSE least(greatest(0.0, {center} - {half}), {p}) END)"
    hi = f"(CASE WHEN ({k}) >= ({n}) THEN 1.0 ELSE greatest(least(1.0, {center} + {half}), {p}) END)"
    return lo, hi
