"""cap_features: the one FEATURE_CAP clamp of sketches of tensors (call_sketch's and the monitor's).

Their clamp of inf and of past-the-cap magnitudes, and call_sketch's refusal of NaN, are tested end to end in
tests/test_monitor_feature_cap.py and tests/test_ingest_sketch_float32_range.py.

    python -m pytest -q tests/test_ingest_cap_features.py
"""

from __future__ import annotations

import math

import torch

from optwin.ingest.sketch import FEATURE_CAP, cap_features
from optwin.monitor import _features

# value -> capped value; NaN stays NaN (compared apart)
CASES = {"one": (1.5, 1.5), "neg_zero": (-0.0, -0.0), "cap": (FEATURE_CAP, FEATURE_CAP),
         "neg_cap": (-FEATURE_CAP, -FEATURE_CAP), "big": (1e300, FEATURE_CAP), "neg_big": (-1e300, -FEATURE_CAP),
         "inf": (math.inf, FEATURE_CAP), "neg_inf": (-math.inf, -FEATURE_CAP)}


def test_cap_features_clamps_magnitudes_and_leaves_nan() -> None:
    sk = {n: v for n, (v, _) in CASES.items()} | {"nan": math.nan}
    out = cap_features(sk)
    assert out is sk  # in place: the callers' dict, no copy
    assert math.isnan(out.pop("nan"))
    assert out == {n: c for n, (_, c) in CASES.items()}
    assert math.copysign(1.0, out["neg_zero"]) == -1.0


def test_monitor_features_pass_a_nan_on() -> None:
    # call_sketch refuses a NaN feature (tests/test_ingest_sketch_float32_range.py); the monitor never did
    names = (*CASES, "nan")
    vals = torch.tensor([v for v, _ in CASES.values()] + [math.nan], dtype=torch.float64)
    got = _features(names, vals)
    assert math.isnan(got.pop("nan")) and got == {n: c for n, (_, c) in CASES.items()}
