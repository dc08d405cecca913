"""Matcher: index, per-call risk, unknown-region rule, errors, calibration, import weight.

    python -m pytest -q tests/test_matcher_core.py
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from _matcher_fixture import _rmsnorm_case, cached_db
from optwin.errors import CatalogError, DatabaseError, SketchError
from optwin.fingerprints.matcher import Matcher
from optwin.fingerprints.matcher import MatcherConfig, continuous_bin
from optwin.fingerprints.regions import feature_bin, region_of

TRIPLE = ("rmsnorm", "native-dtype", "float16")


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return cached_db(str(tmp_path_factory.mktemp("fp") / "fp.duckdb"))


@pytest.fixture(scope="module")
def m(db) -> Matcher:
    return Matcher.open(db)


def sk(absmax: float, rms: float, hidden: float = 64.0) -> dict[str, float]:
    return {"numel": 4 * hidden, "rows": 4.0, "absmax": absmax, "rms": rms, "nonfinite": 0.0, "hidden": hidden,
            "max_row_rms": rms, "weight_absmax": 1.0}


def test_open_loads_every_triple_of_the_build(m):
    assert m.build_id == "fixture-0"
    assert set(m.index) == {TRIPLE, ("rmsnorm", "fp32-acc", "float16"), ("rope", "low-precision-angles", "float16"),
                            ("softmax", "naive", "float16")}
    assert all(len(ti.probs) > 10 for ti in m.index.values())


def test_assess_from_tensors_matches_the_twin(m):
    g = torch.Generator().manual_seed(1)
    safe = m.assess(*TRIPLE, inputs=_rmsnorm_case(g, 20.0, 64))
    hot = m.assess(*TRIPLE, inputs=_rmsnorm_case(g, 600.0, 64))
    assert not safe.warn and safe.max_probability < 0.2
    assert hot.warn and hot.probability["precision_loss"] >= 0.9  # x*x overflows float16 past |x| = 256
    assert set(hot.probability) == {"nonfinite", "precision_loss"}
    assert hot.region == region_of("rmsnorm", hot.sketch)
    # The fp32-acc variant squares in float32: the same input is safe there.
    assert not m.assess("rmsnorm", "fp32-acc", "float16", inputs=_rmsnorm_case(g, 600.0, 64)).warn


def test_assess_from_sketch_and_threshold_is_configurable(db):
    strict = Matcher.open(db, config=MatcherConfig(threshold=0.99))
    loose = Matcher.open(db, config=MatcherConfig.preset("sensitive"))
    s = sk(600.0, 250.0)
    r = loose.assess(*TRIPLE, sketch=s)
    assert r.known and r.warn and r.sketch["absmax"] == 600.0
    assert strict.assess(*TRIPLE, sketch=s).warn == (r.max_probability >= 0.99)


def test_continuous_bin_agrees_with_region_binning():
    for f in ("absmax", "max_row_rms", "hidden", "max", "max_pos", "min_sep_deg"):
        for v in (0.0, 1e-13, 0.3, 1.0, 255.0, 256.0, 65504.0, -3.5, -300.0, 2.0**21):
            assert int(continuous_bin(f, v)) == feature_bin(f, v), (f, v)


def test_unknown_beyond_the_replayed_range_is_conservative(m):
    r = m.assess(*TRIPLE, sketch=sk(1e9, 1e8))
    assert not r.known and r.rule == "beyond"
    assert r.probability["precision_loss"] == 1.0 and r.warn
    # a fault type the build never saw for the triple stays 0 beyond the range
    assert r.probability["nonfinite"] == 0.0


def test_unknown_inside_the_range_uses_neighbours(m):
    ti = m.index[TRIPLE]
    # a wider model than the sweep (hidden is a shape: clamped, not "beyond")
    r = m.assess(*TRIPLE, sketch=sk(4.0, 1.5, hidden=8192.0))
    assert not r.known and r.rule in ("near", "dominating") and not r.warn
    # an off-manifold cell (row rms == absmax, never replayed) below the boundary stays safe
    r2 = m.assess(*TRIPLE, sketch=sk(40.0, 40.0))
    assert r2.region not in ti.probs and not r2.known and not r2.warn
    # and above it, warns
    assert m.assess(*TRIPLE, sketch=sk(400.0, 400.0)).warn


@pytest.mark.parametrize("bad,msg", [
    ({"absmax": 1.0}, "missing features"),
    ({**sk(1.0, 1.0), "absmax": math.nan}, "finite"),
    ({**sk(1.0, 1.0), "absmax": "3"}, "number"),
    ({**sk(1.0, 1.0), "absmax": True}, "number"),
    ({**sk(1.0, 1.0), "absmax": -1.0}, ">= 0"),
    ([1, 2], "JSON object"),
])
def test_bad_sketches_raise_one_line_sketch_errors(m, bad, msg):
    with pytest.raises(SketchError, match=msg) as e:
        m.assess(*TRIPLE, sketch=bad)
    assert "\n" not in str(e.value)


def test_unknown_names_raise_catalog_errors(m):
    with pytest.raises(CatalogError, match="unknown operator"):
        m.assess("gelu", "x", "float16", sketch={})
    with pytest.raises(CatalogError, match="unknown variant"):
        m.assess("rmsnorm", "nope", "float16", sketch=sk(1, 1))
    with pytest.raises(CatalogError, match="unsupported dtype"):
        m.assess("geodesic", "acos", "float16", sketch={})


def test_missing_database_is_a_database_error(tmp_path):
    with pytest.raises(DatabaseError, match="run `optwin build`"):
        Matcher.open(tmp_path / "none.duckdb")


def test_calibration_on_held_out_cases(m):
    c = m.calibration()
    assert c["n_cases"] > 50
    pt = c["per_fault_type"]["precision_loss"]
    assert pt["brier"] < 0.05 and pt["skill"] > 0.7  # far better than predicting the base rate
    top = [row for row in c["reliability"] if row["bin"].startswith("[0.9")]
    assert top and top[0]["mean_observed"] > 0.8
    low = c["reliability"][0]
    assert low["bin"].startswith("[0.0") and low["mean_observed"] < 0.1


def test_matcher_import_stays_light():
    code = ("import sys; from optwin.fingerprints.matcher import Matcher; import optwin.fingerprints.forecast, "
            "optwin.fingerprints.sidecar, optwin.fingerprints.client; "
            "bad = [m for m in ('duckdb', 'triton', 'ray', 'streamlit', 'polars') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_unreplayed_cell_takes_the_distance_weighted_mean_of_its_neighbours():
    # rmsnorm native-dtype float16 regions are (absmax bin, max_row_rms bin); two replayed cells four
    # bins apart, a safe one and a faulting one: a cell between them leans toward the nearer side.
    rows = [{"op": "rmsnorm", "variant": "native-dtype", "dtype": "float16", "region": key, "fault_type": "precision_loss",
             "probability": p, "n_cases": 8} for key, p in (("300|290", 0.0), ("300|294", 1.0))]
    ti = Matcher.from_rows(rows).index[TRIPLE]
    near_safe, _ = ti.lookup((300, 291), MatcherConfig())
    near_fault, rule = ti.lookup((300, 293), MatcherConfig())
    assert rule == "near" and 0.0 < near_safe[1] < 0.5 < near_fault[1] < 1.0
    # equal weights at equal distance: the midpoint is the plain mean
    mid, _ = ti.lookup((300, 292), MatcherConfig())
    assert mid[1] == pytest.approx(0.5)


def test_the_grid_separates_tiny_magnitudes_and_masked_rows():
    # below 1 the bins keep going: fp16 squares go subnormal near |x| = 1e-4, and matmul loses
    # precision on subnormal products, so 1e-5, 1e-4 and 1e-3 must be different cells
    bins = [feature_bin("absmax", v) for v in (1e-5, 1e-4, 1e-3, 1.0)]
    assert bins == sorted(set(bins)) and bins[1] - bins[0] >= 6
    # one fully masked softmax row (a NaN) is far from none: neighbours never blur the two
    assert feature_bin("masked_rows", 1.0) - feature_bin("masked_rows", 0.0) >= 16
