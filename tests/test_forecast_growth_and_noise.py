"""The stream forecast's trend: additive growth (decode positions) is not read as exponential, and
flat noisy streams never warn, while exponential drifts keep an accurate eta.

    python -m pytest -q tests/test_forecast_growth_and_noise.py

Fed straight into Stream (no HTTP), on the matcher fixture: rope low-precision-angles float16 faults
from max_pos 2^11, rmsnorm native-dtype float16 from |x| ~256.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from optwin.fingerprints.matcher import Matcher
from optwin.ingest import sketch

RATE = 20.0  # calls (tokens) per second
RMS_BASE = {"numel": 1024.0, "rows": 4.0, "absmax": 1.0, "rms": 0.3, "nonfinite": 0.0, "hidden": 256.0,
            "max_row_rms": 0.3, "weight_absmax": 1.0}


@pytest.fixture(scope="module")
def rope_sk():
    tpl = sketch("rope", {"x": torch.randn(1, 2, 16, generator=torch.Generator().manual_seed(0)).half(),
                          "positions": torch.tensor([0])})
    return lambda pos: dict(tpl, max_pos=float(pos))


def _rms(a: float) -> dict[str, float]:
    return dict(RMS_BASE, absmax=a, rms=a / 3, max_row_rms=a / 3)


def _first_warning_value(m: Matcher, op: str, variant: str, make, lo: float, hi: float) -> float:
    """The smallest value the matcher warns at, by bisection between a safe lo and a warning hi."""
    warns = lambda v: m.assess(op, variant, "float16", sketch=make(v)).warn  # noqa: E731
    assert not warns(lo) and warns(hi)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if warns(mid) else (mid, hi)
    return hi


def test_decoding_requests_do_not_warn(m, rope_sk):
    """Four 300-token requests in a row at 20 tokens/s: max_pos climbs 0 -> 299 and restarts, 7x below the
    fault. The log-scale trend read 0 -> 48 as an explosion: 4 warning episodes, eta ~4 s."""
    s = m.stream("l0.rope", "rope", "low-precision-angles", "float16")
    t = 0.0
    for _ in range(4):
        for pos in range(300):
            r = s.observe(sketch=rope_sk(pos), t=t)
            assert r.max_probability < m.config.threshold
            assert not r.warn and not r.forecast_warn, (t, pos, r.eta_s)
            t += 1.0 / RATE
    assert s.n_episodes == 0


def test_linear_positions_eta_is_the_time_left(m, rope_sk):
    """A long decode from 0 at 20 tokens/s: once the trend is in (3 s), eta is the true time to the first
    position the matcher warns at, within 1.5x (it was 5x short at 10 s), and the warning comes ~horizon_s
    before the fault, not 100 s early."""
    crit = _first_warning_value(m, "rope", "low-precision-angles", rope_sk, 1.0, 1e5)
    s = m.stream("l0.rope", "rope", "low-precision-angles", "float16")
    first_warn = None
    checked = 0
    for i in range(int(crit)):  # position i at i / RATE seconds
        t = i / RATE
        r = s.observe(sketch=rope_sk(i), t=t)
        left = crit / RATE - t
        if t >= 3.0 and left > 1.0:
            assert r.eta_s is not None and left / 1.5 <= r.eta_s <= left * 1.5, (t, r.eta_s, left)
            checked += 1
        if r.warn and first_warn is None:
            first_warn = left
    assert checked > 1000
    assert first_warn is not None and 25.0 <= first_warn <= 1.1 * s.cfg.horizon_s


@pytest.mark.parametrize("doubling_s", [5.0, 20.0])
def test_exponential_drift_keeps_an_accurate_eta(m, doubling_s):
    """|x| doubles every doubling_s from 1 (calls every 0.5 s): the eta follows the true time left within
    10 % once established, and the warning comes with the horizon's lead."""
    crit = _first_warning_value(m, "rmsnorm", "native-dtype", _rms, 1.0, 1e4)
    true_t = doubling_s * math.log2(crit)
    s = m.stream("l0.norm", "rmsnorm", "native-dtype", "float16")
    first_warn = None
    for i in range(int(true_t / 0.5)):
        t = 0.5 * i
        r = s.observe(sketch=_rms(2 ** (t / doubling_s)), t=t)
        left = true_t - t
        if t >= 10.0 and left > 1.0 and left < s.cfg.lookahead_s * 0.9:
            assert r.eta_s is not None and abs(r.eta_s - left) <= 0.1 * left + 0.5, (t, r.eta_s, left)
        if r.warn and first_warn is None:
            first_warn = left
    assert first_warn is not None and 27.0 <= first_warn <= 1.1 * s.cfg.horizon_s


@pytest.mark.parametrize("sigma", [0.2, 0.3])
def test_flat_lognormal_noise_never_warns(m, sigma):
    """|x| = 10 * lognormal(sigma) at 20 calls/s for 5 minutes, 26x below the fault, 4 seeds: no warning.
    The sign test on 8 lagged slopes passed ~7 % of pure-noise refits (4-16 episodes a stream)."""
    for seed in range(4):
        rng = random.Random(seed)
        s = m.stream("l1.norm", "rmsnorm", "native-dtype", "float16")
        for i in range(int(300 * RATE)):
            r = s.observe(sketch=_rms(10.0 * math.exp(rng.gauss(0.0, sigma))), t=i / RATE)
            assert not r.forecast_warn, (sigma, seed, r.t, r.eta_s)
        assert s.n_episodes == 0


def test_noisy_exponential_drift_still_warns_early(m):
    """Real drifts keep their lead under the stricter test: |x| doubling every 10 s with 10-20 % lognormal
    noise at 20 calls/s warns >= 20 s before the first call in a fault cell."""
    for seed, sigma in ((0, 0.1), (1, 0.2)):
        rng = random.Random(seed)
        s = m.stream("l2.norm", "rmsnorm", "native-dtype", "float16")
        first_warn = fault = None
        i = 0
        while fault is None:
            t = i / RATE
            r = s.observe(sketch=_rms(2 ** (t / 10.0) * math.exp(rng.gauss(0.0, sigma))), t=t)
            if r.warn and first_warn is None:
                first_warn = t
            if r.max_probability >= m.config.threshold:
                fault = t
            i += 1
        assert first_warn is not None and fault - first_warn >= 20.0, (sigma, first_warn, fault)
