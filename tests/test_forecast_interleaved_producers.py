"""A stream fed by several producers (replicas posting batches to one sidecar under one stream name):
their calls interleave slightly out of order, which must not wipe the forecast's history; only a large
step back in time (a restarted producer's clock) does.

    python -m pytest -q tests/test_forecast_interleaved_producers.py

Fed straight into Stream (no HTTP), on the matcher fixture: rmsnorm native-dtype float16, |x| doubling
every 10 s from 1 (a fault cell from ~256, t ~80 s).
"""

from __future__ import annotations

import pytest

from optwin.fingerprints.matcher import Matcher

BASE = {"numel": 1024.0, "rows": 4.0, "absmax": 1.0, "rms": 0.3, "nonfinite": 0.0, "hidden": 256.0,
        "max_row_rms": 0.3, "weight_absmax": 1.0}


def _sk(t: float) -> dict[str, float]:
    a = 2 ** (t / 10.0)
    return dict(BASE, absmax=a, rms=a / 3, max_row_rms=a / 3)


def _run(m: Matcher, producers: int, lag_s: float) -> tuple[float | None, float | None, float | None]:
    """Each producer flushes a batch of its 20 calls of the last second once a second (20 calls/s each),
    producer p's clock lagging by p * lag_s. (first forecast t, first warning t, first fault-cell t)."""
    s = m.stream("model.layers.3.mlp.norm:rmsnorm", "rmsnorm", "native-dtype", "float16")
    first_eta = first_warn = fault = None
    for sec in range(100):
        for p in range(producers):
            for k in range(20):
                t = sec + 0.025 * p + k * 0.05 - p * lag_s
                r = s.observe(sketch=_sk(t), t=t)
                if r.eta_s is not None and r.eta_s > 0 and first_eta is None:
                    first_eta = t
                if r.warn and first_warn is None:
                    first_warn = t
                if r.max_probability >= m.config.threshold and fault is None:
                    fault = t
    return first_eta, first_warn, fault


@pytest.mark.parametrize("lag_s", [0.0, 3.0])
def test_two_producers_forecast_like_one(m, lag_s):
    """Two replicas' batches interleave (the second one's calls up to 1 s, or 4 s, older than the newest):
    the forecast comes as early and warns as far ahead as with one producer. Each batch used to read as
    'clock went backwards' and clear the history: no forecast, the warning only at the fault."""
    one_eta, one_warn, one_fault = _run(m, 1, 0.0)
    eta, warn, fault = _run(m, 2, lag_s)
    assert one_eta is not None and one_eta < 5.0 and one_fault - one_warn >= 25.0
    assert eta is not None and eta < 5.0 + lag_s, eta
    assert warn is not None and fault - warn >= 25.0, (warn, fault)
    assert abs((fault - warn) - (one_fault - one_warn)) <= 1.0 + lag_s


def test_a_large_step_back_is_a_restart(m):
    """A step back of more than reorder_s is a restarted producer: the history goes (no forecast until
    min_points calls again); a small one keeps it."""
    s = m.stream("s", "rmsnorm", "native-dtype", "float16")
    for i in range(400):
        r = s.observe(sketch=_sk(0.05 * i), t=0.05 * i)
    assert r.eta_s is not None
    r = s.observe(sketch=_sk(19.0 - s.cfg.reorder_s / 2), t=19.95 - s.cfg.reorder_s / 2)
    assert r.eta_s is not None  # a late call of another producer: the forecast stands
    r = s.observe(sketch=_sk(0.0), t=19.95 - 2 * s.cfg.reorder_s)
    assert r.eta_s is None  # a restart: the history starts over
    t0 = 19.95 - 2 * s.cfg.reorder_s
    for i in range(1, 400):
        r = s.observe(sketch=_sk(0.05 * i), t=t0 + 0.05 * i)
    assert r.eta_s is not None  # and the new history forecasts again
