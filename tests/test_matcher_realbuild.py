"""The matcher on a REAL build (optwin.fingerprints.build, rmsnorm only, small): open, calibration,
a drifting stream warned before its first fault, a flat one never.

    python -m pytest -q tests/test_matcher_realbuild.py
"""

from __future__ import annotations

import pytest
import torch

from _matcher_fixture import _rmsnorm_case
from optwin import twin
from optwin.fingerprints.matcher import Matcher


@pytest.fixture(scope="module")
def m(tmp_path_factory) -> Matcher:
    from optwin.fingerprints.build import BuildConfig, build

    out = str(tmp_path_factory.mktemp("real") / "fp.duckdb")
    build(BuildConfig(out=out, ops=("rmsnorm",), cases=24, replays=4, quick=True, include_triton=False, workers=2))
    return Matcher.open(out)


def test_real_build_loads_and_calibrates(m):
    assert ("rmsnorm", "native-dtype", "float16") in m.index
    c = m.calibration()
    assert c["n_cases"] > 0 and c["brier"] is not None and 0.0 <= c["brier"] < 0.1
    assert sum(row["n"] for row in c["reliability"]) > 0


def test_real_build_drift_warns_before_the_fault_and_flat_stays_quiet(m):
    s = m.stream("layers.0.norm", "rmsnorm", "native-dtype", "float16")
    g = torch.Generator().manual_seed(3)
    first_warn = first_fault = None
    for i in range(130):
        t = 0.5 * i
        inputs = _rmsnorm_case(g, 8.0 * 2 ** (t / 10), 64)
        r = s.observe(inputs=inputs, t=t)
        if r.warn and first_warn is None:
            first_warn = t
        if first_fault is None and any(twin.run("rmsnorm", "native-dtype", "float16", inputs).faults.values()):
            first_fault = t
    assert first_fault is not None and first_warn is not None and first_fault - first_warn > 0
    flat = m.stream("layers.1.norm", "rmsnorm", "native-dtype", "float16")
    assert not any(flat.observe(inputs=_rmsnorm_case(g, 8.0 * (1 + 0.1 * float(torch.randn((), generator=g))), 64),
                                t=0.5 * i).warn for i in range(400))
