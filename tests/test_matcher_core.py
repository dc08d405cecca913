"""Matcher: index, per-call risk, unknown-region rule, errors, calibration, import weight.

    python -m pytest -q tests/test_matcher_core.py
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from _matcher_fixture import _rmsnorm_case
from optwin.errors import CatalogError, DatabaseError, SketchError
from optwin.fingerprints.matcher import Matcher
from optwin.fingerprints.matcher import MatcherConfig, continuous_bin
from optwin.fingerprints.regions import feature_bin, region_of

TRIPLE = ("rmsnorm", "native-dtype", "float16")


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


def test_nonfinite_inputs_are_certain_nonfinite_faults(m):
    # No build replays NaN or inf inputs, yet any such input runs through to the output: the matcher says so
    # itself rather than answering from the cell of the finite values around it.
    g = torch.Generator().manual_seed(3)
    inputs = _rmsnorm_case(g, 4.0, 64)
    calm = m.assess(*TRIPLE, inputs=inputs)
    assert calm.probability["nonfinite"] == 0.0 and not calm.warn
    inputs["x"][1, 5] = math.nan
    r = m.assess(*TRIPLE, inputs=inputs)
    assert r.sketch["nonfinite"] == 1.0
    assert r.probability["nonfinite"] == 1.0 and r.warn and r.known and r.rule == "nonfinite_input"
    assert r.probability["precision_loss"] == calm.probability["precision_loss"]  # the rest from the cell
    s = m.stream("l0.norm", *TRIPLE)
    assert s.observe(sketch={**sk(4.0, 1.0), "nonfinite": 2.0}, t=0.0).warn


def test_huge_sketch_values_are_clamped_and_bad_fractions_refused(m):
    from optwin.ingest.sketch import FEATURE_CAP

    capped = m.assess(*TRIPLE, sketch=sk(FEATURE_CAP, 1.0))
    for v in (1e300, 10**300):  # their bins used to overflow (OverflowError) in the matcher and the forecast
        r = m.assess(*TRIPLE, sketch=sk(v, 1.0))
        assert r.region == capped.region and r.probability == capped.probability and r.warn
        assert m.stream("huge", *TRIPLE).observe(sketch=sk(v, 1.0), t=0.0).warn
    with pytest.raises(SketchError, match="numel must be finite"):
        m.assess(*TRIPLE, sketch={**sk(1.0, 1.0), "numel": 10**400})
    soft = {"numel": 64.0, "rows": 2.0, "absmax": 3.0, "rms": 1.0, "nonfinite": 0.0, "n": 32.0, "max": 3.0,
            "min": -3.0, "max_row_range": 6.0, "masked_rows": 0.0, "masked_frac": 0.0, "peaked_frac": 0.5,
            "min_row_max": 1.0}
    m.assess("softmax", "naive", "float16", sketch=soft)
    with pytest.raises(SketchError, match="peaked_frac must be within"):
        m.assess("softmax", "naive", "float16", sketch={**soft, "peaked_frac": 5.0})
    with pytest.raises(SketchError, match="inputs .tensors. or a sketch, not both"):
        m.assess(*TRIPLE, inputs=_rmsnorm_case(torch.Generator().manual_seed(0), 1.0, 64), sketch=sk(1.0, 1.0))


def test_tensors_must_be_in_the_dtype_of_the_call(m):
    from optwin.errors import InputError
    from optwin.ingest import sketch as ingest_sketch

    inputs = _rmsnorm_case(torch.Generator().manual_seed(0), 1.0, 64)
    with pytest.raises(InputError, match="'x' must be float16, got float32"):
        m.assess(*TRIPLE, inputs={**inputs, "x": inputs["x"].float() * 1e6})  # 1e6: impossible in float16
    with pytest.raises(InputError, match="'x' must be float16, got int64"):
        m.stream("s", *TRIPLE).observe(inputs={**inputs, "x": inputs["x"].long()}, t=0.0)
    # the sketch alone takes any float width (a float32 model), never integers, bools or complex numbers
    ingest_sketch("rmsnorm", {**inputs, "x": inputs["x"].float()})
    for bad in (inputs["x"].long(), inputs["x"] > 0, inputs["x"].to(torch.complex64)):
        with pytest.raises(InputError, match="'x' must be a floating tensor"):
            ingest_sketch("rmsnorm", {**inputs, "x": bad})
    with pytest.raises(InputError, match="'positions' must be an integer tensor, got float32"):
        ingest_sketch("rope", {"x": torch.randn(4, 2, 8).half(), "positions": torch.arange(4.0)})
    with pytest.raises(InputError, match="'x' is on the meta device"):
        ingest_sketch("rmsnorm", {**inputs, "x": inputs["x"].to("meta")})


@pytest.mark.parametrize("t", [math.nan, math.inf, "abc", True, None])
def test_stream_times_must_be_finite_seconds(m, t):
    from optwin.errors import InputError

    s = m.stream("s", *TRIPLE)
    s.observe(sketch=sk(1.0, 1.0), t=0.0)
    if t is None:  # now, by the monotonic clock
        assert s.observe(sketch=sk(1.0, 1.0)).t > 0.0
        return
    with pytest.raises(InputError, match="t must be a finite number of seconds"):
        s.observe(sketch=sk(1.0, 1.0), t=t)
    assert s.n_observed == 1


def test_a_build_of_some_ops_keeps_the_others_current(db, tmp_path):
    import shutil

    from optwin.fingerprints.store import open_store

    path = str(tmp_path / "two.duckdb")
    shutil.copyfile(db, path)
    first = Matcher.open(path)
    store = open_store(path, read_only=False)
    try:  # a second, newer build of rmsnorm native-dtype alone: every cell's probability changed
        c = store.conn
        c.execute("INSERT INTO builds SELECT 'rms-only', created_at + INTERVAL 1 HOUR, code_version, twin_version, "
                  "seed, flags, profile, replays, noise, engine, n_cases, n_replays, duration_s FROM builds")
        c.execute("INSERT INTO fingerprints SELECT 'rms-only', op, variant, dtype, region, fault_type, n_cases, n_replays,"
                  " n_replays - n_faults, 1.0 - probability, ci_low, ci_high, severity, feature_lo, feature_hi, "
                  "n_cases - det_faults FROM fingerprints WHERE op = 'rmsnorm' AND variant = 'native-dtype'")
        for table in ("cases", "outcomes"):  # and its cases: the held-out ones calibrate it
            cols = [r[0] for r in c.execute(f"DESCRIBE {table}").fetchall()][1:]
            c.execute(f"INSERT INTO {table} SELECT 'rms-only', {', '.join(cols)} FROM {table} WHERE case_id IN "
                      "(SELECT case_id FROM cases WHERE op = 'rmsnorm' AND variant = 'native-dtype')")
        store.checkpoint()
    finally:
        store.close()
    m2 = Matcher.open(path)
    assert m2.build_id == "rms-only" and set(m2.index) == set(first.index)
    assert m2.builds[TRIPLE] == "rms-only"
    others = [t for t in first.index if t != TRIPLE]
    assert others and all(m2.builds[t] == first.build_id for t in others)
    for t in others:  # served as before, not as unbuilt
        assert m2.index[t].probs == first.index[t].probs
    region = next(iter(first.index[TRIPLE].probs))
    assert m2.index[TRIPLE].probs[region] == pytest.approx(tuple(1.0 - p for p in first.index[TRIPLE].probs[region]))
    assert Matcher.open(path, build_id=first.build_id).index[TRIPLE].probs == first.index[TRIPLE].probs
    with pytest.raises(DatabaseError, match="no build 'nope'"):
        Matcher.open(path, build_id="nope")
    assert m2.calibration()["n_cases"] == first.calibration()["n_cases"]  # each triple's own held-out cases

