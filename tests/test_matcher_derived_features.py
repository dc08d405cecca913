"""Region features derived from a sketch's others (regions.DERIVED: layernorm's const_odd_width) reach every
place a sketch is placed on the grid: assess, a stream's forecast, and a build's case rows. Producers never
send them (SKETCH_FEATURES is unchanged), so a sketch without one must still be matched."""

from __future__ import annotations

import pytest

from optwin.fingerprints.matcher import Matcher
from optwin.fingerprints.regions import feature_bin, region_values
from optwin.ingest.sketch import SKETCH_FEATURES

# A float16 layernorm call with an exactly constant row of 700 (and no varying row)
CONST_SKETCH = {"numel": 1536.0, "rows": 4.0, "absmax": 700.0, "rms": 700.0, "nonfinite": 0.0, "hidden": 384.0,
                "max_mean_over_std": 0.0, "min_row_std": 0.0, "weight_absmax": 1.0, "bias_absmax": 0.5,
                "const_absmax": 700.0}


def test_the_derived_flag_is_not_asked_of_producers() -> None:
    assert "const_odd_width" not in SKETCH_FEATURES["layernorm"]
    assert region_values("layernorm", CONST_SKETCH)[-1] == 1.0
    assert region_values("layernorm", dict(CONST_SKETCH, hidden=1024.0, numel=4096.0))[-1] == 0.0


@pytest.mark.parametrize("hidden,flag", [(384.0, 1.0), (1024.0, 0.0)])
def test_assess_and_a_stream_place_the_sketch_with_its_derived_flag(m: Matcher, hidden: float, flag: float) -> None:
    sk = dict(CONST_SKETCH, hidden=hidden, numel=4 * hidden)
    r = m.assess("layernorm", "torch", "float16", sketch=sk)
    assert r.sketch["const_odd_width"] == flag and r.region[-1] == feature_bin("const_odd_width", flag)
    assert m.stream("ln", "layernorm", "torch", "float16").observe(sketch=sk, t=0.0).region == r.region
    # the forecast bins every observation with TripleIndex.coordinates
    coords = m.triple_index("layernorm", "torch", "float16").coordinates(sk)
    assert len(coords) == 4 and int(coords[-1]) == r.region[-1]
