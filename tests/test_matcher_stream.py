"""Streams: drift forecasts with a positive lead time, no warnings on flat safe streams, hysteresis,
dynamic sampling.

    python -m pytest -q tests/test_matcher_stream.py
"""

from __future__ import annotations

import pytest
import torch

from _matcher_fixture import _rmsnorm_case, _rope_case, rope_true_p
from optwin import twin
from optwin.fingerprints.forecast import ForecastConfig
from optwin.fingerprints.sampling import Sampler, SamplingConfig
from optwin.ingest import sketch


def test_growing_activations_warn_before_the_first_rmsnorm_fault(m):
    """|x| doubles every 10 s from 8: native-dtype float16 overflows x*x past 256 (t ~ 50 s)."""
    s = m.stream("layers.0.norm", "rmsnorm", "native-dtype", "float16")
    g = torch.Generator().manual_seed(3)
    first_warn = first_fault = None
    etas = []
    for i in range(130):
        t = 0.5 * i
        inputs = _rmsnorm_case(g, 8.0 * 2 ** (t / 10), 64)
        r = s.observe(inputs=inputs, t=t)
        faulted = any(twin.run("rmsnorm", "native-dtype", "float16", inputs).faults.values())
        if r.warn and first_warn is None:
            first_warn = t
        if r.eta_s is not None and first_fault is None and i >= 20:
            etas.append((t, r.eta_s))
        if faulted and first_fault is None:
            first_fault = t
    assert first_fault is not None and first_warn is not None
    lead = first_fault - first_warn
    assert lead > 0, (first_warn, first_fault)
    assert lead >= 20.0  # at least most of the 30 s horizon
    # once the trend is established, eta tracks the real time left within 25%
    t_mid, eta_mid = [e for e in etas if e[0] >= 30.0][0]
    assert abs(eta_mid - (first_fault - t_mid)) <= 0.25 * (first_fault - t_mid)


def test_growing_rope_positions_warn_before_the_first_fault(m):
    """Positions grow 40/s from 16; the precision-loss curve of the fixture crosses 0.5 at 2^11."""
    s = m.stream("rope.0", "rope", "low-precision-angles", "float16")
    g = torch.Generator().manual_seed(4)
    first_warn = first_fault = None
    for i in range(120):
        t = 1.0 * i
        sk = sketch("rope", _rope_case(g, 16.0 + 40.0 * t))
        r = s.observe(sketch=sk, t=t)
        if r.warn and first_warn is None:
            first_warn = t
        if rope_true_p(sk) > 0.5 and first_fault is None:
            first_fault = t
    assert first_fault is not None and first_warn is not None
    assert first_fault - first_warn > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flat_safe_stream_never_warns(m, seed):
    s = m.stream("layers.1.norm", "rmsnorm", "native-dtype", "float16")
    g = torch.Generator().manual_seed(seed)
    warned = 0
    for i in range(600):
        level = 8.0 * (1.0 + 0.1 * float(torch.randn((), generator=g)))
        r = s.observe(inputs=_rmsnorm_case(g, level, 64), t=0.5 * i)
        warned += r.warn or r.forecast_warn
    assert warned == 0
    assert s.n_episodes == 0


def test_hysteresis_no_flapping(m):
    """A stream jumping in and out of the fault region every other call opens one warning episode."""
    s = m.stream("flappy", "rmsnorm", "native-dtype", "float16")
    g = torch.Generator().manual_seed(5)
    verdicts = []
    for i in range(40):
        level = 600.0 if i % 2 else 8.0
        verdicts.append(s.observe(inputs=_rmsnorm_case(g, level, 64), t=float(i)).warn)
    assert s.n_episodes == 1
    assert all(verdicts[1:])  # stays in the warning state while it keeps coming back
    for i in range(40, 60):  # calm again: leaves after exit_calls calm calls
        r = s.observe(inputs=_rmsnorm_case(g, 8.0, 64), t=float(i))
    assert not r.warn and s.n_episodes == 1


def test_forecast_presets_and_eta_band(m):
    s = m.stream("eager", "rmsnorm", "native-dtype", "float16", forecast=ForecastConfig.preset("eager"))
    g = torch.Generator().manual_seed(6)
    for i in range(25):  # |x| 16 -> 84: still safe, heading for 256
        r = s.observe(inputs=_rmsnorm_case(g, 16.0 * 2 ** (i / 10), 64), t=float(i))
    assert r.eta_s is not None and r.eta_low_s <= r.eta_s <= (r.eta_high_s or float("inf"))
    assert len(r.velocity) == 2 and r.velocity[0] > 0 and r.velocity[1] > 0  # absmax and row rms climb


def test_sampling_warmup_floor_and_burst():
    s = Sampler(SamplingConfig())
    checks = [s.should_check() for _ in range(100)]
    assert all(checks)
    for _ in range(100):
        s.record(False)
    calm = sum(s.should_check() for _ in range(1000))
    assert calm == 10  # 1% of calm calls
    for _ in range(3):
        s.record(True)
    assert s.burst_left == 100 and s.rate == 1.0
    assert all(s.should_check() for _ in range(100))
    assert s.rate < 1.0  # back to sampling after the burst
    assert 0.01 < s.rate <= 0.1 * (s.warn_rate ** 0.5) + 1e-12


def test_sampling_presets():
    always = Sampler(SamplingConfig.preset("always"))
    assert all(always.should_check() for _ in range(500))
    with pytest.raises(Exception, match="unknown sampling preset"):
        SamplingConfig.preset("nope")
