"""layernorm's derived flag `const_odd_width` on the dashboard: shown as 0/1, listed in a case's sketch, and a
database binned without it refused with the matcher's one line.

    python -m pytest -q tests/test_s48_dashboard_flags.py

The flag is binned with scale 1e-6 (0 and 1 ~20 bins apart), so its bin's lower edge, which the pages showed, read
0.524287 and a boundary "const_odd_width >= 0.5243"; the Cases page listed the stored sketch, which never holds a
derived feature; and a database built before the flag (layernorm regions of 3 bins) rendered NaN probabilities
beside a made-up const_odd_width of 0 (and one such op blanked every op's probabilities on Compare builds). A real
quick layernorm build (a few seconds), and copies whose region keys lose their last bin, as such a database has them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest

from optwin.dashboard.data import bin_value, open_data
from optwin.fingerprints.build import BuildConfig, build
from optwin.fingerprints.regions import bin_lower_edge, feature_bin, with_derived
from test_dashboard_fixture import direct, make_db
from test_dashboard_pages import app, metrics

@pytest.fixture(scope="module")
def real_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("flags") / "fp.duckdb"
    build(BuildConfig(out=str(out), ops=("layernorm",), quick=True, cases=8, replays=2, seed=0, workers=1,
                      include_triton=False))
    return out


def explorer(db: Path, variant: str = "torch", dtype: str = "float16"):
    at = app(db, "pages/2_Operator_explorer.py")
    at.selectbox(key="ex_variant").set_value(variant).run()
    at.selectbox(key="ex_dtype").set_value(dtype).run()
    return at


def test_bin_value_maps_a_flags_bins_back_to_0_and_1() -> None:
    assert [bin_value("const_odd_width", feature_bin("const_odd_width", v)) for v in (0.0, 1.0)] == [0.0, 1.0]
    assert bin_lower_edge("const_odd_width", feature_bin("const_odd_width", 1.0)) < 0.6  # what was shown
    # magnitudes keep their lower edge
    assert bin_value("absmax", 40) == bin_lower_edge("absmax", 40)
    assert bin_value("masked_rows", 19) == bin_lower_edge("masked_rows", 19)


def test_the_explorer_shows_the_flag_as_0_and_1(real_db: Path, tmp_path: Path) -> None:
    # which cells fault varies from build to build: in a copy, the flag-1 cells of one triple's precision_loss all
    # fault and the flag-0 ones none, so the boundary along the flag is at its 1 (the flag is the key's last bin)
    db = tmp_path / "set.duckdb"
    shutil.copy(real_db, db)
    flag1 = f"region LIKE '%|{feature_bin('const_odd_width', 1.0)}'"
    variant, dtype = direct(db, f"SELECT variant, dtype FROM fingerprints WHERE {flag1} ORDER BY 1, 2 LIMIT 1")[0]
    with duckdb.connect(str(db)) as c:
        c.execute(f"UPDATE fingerprints SET n_faults = CASE WHEN {flag1} THEN n_replays ELSE 0 END, "
                  f"probability = CASE WHEN {flag1} THEN 1.0 ELSE 0.0 END "
                  "WHERE variant = ? AND dtype = ? AND fault_type = 'precision_loss'", [variant, dtype])
    at = explorer(db, variant, dtype)
    at.selectbox(key="ex_fault").set_value("precision_loss").run()
    regions = at.dataframe[-1].value  # the Regions table, the page's last
    assert "region" in regions and set(regions["const_odd_width"]) == {0.0, 1.0}
    at.radio(key="ex_value").set_value("probability").run()
    at.selectbox(key="ex_curve").set_value("const_odd_width").run()
    at.slider(key="ex_threshold").set_value(0.5).run()
    assert not at.exception, [e.value for e in at.exception]
    assert metrics(at)["Boundary"] == "const_odd_width ≥ 1"


def test_the_cases_sketch_lists_the_derived_flag(real_db: Path) -> None:
    at = app(real_db, "pages/3_Cases.py")
    # a triple with failing cases (the page lists only those): which ones fail varies from build to build
    variant, dtype = direct(real_db, "SELECT variant, dtype FROM representatives ORDER BY 1, 2 LIMIT 1")[0]
    at.selectbox(key="cs_variant").set_value(variant).run()
    at.selectbox(key="cs_dtype").set_value(dtype).run()
    case_id = at.selectbox(key="cs_case").value
    assert case_id is not None, "the build has no failing case to show"
    (stored,) = direct(real_db, "SELECT sketch FROM cases WHERE case_id = ?", [case_id])[0]
    stored = json.loads(stored)
    assert "const_odd_width" not in stored
    (table,) = [d.value for d in at.dataframe if "feature" in d.value]  # the sketch table
    table = table.set_index("feature")
    want = with_derived("layernorm", stored)["const_odd_width"]
    assert table.loc["const_odd_width", "value"] == want
    assert table.loc["const_odd_width", "region feature"] and table.loc["const_odd_width", "derived"]
    assert not table.loc["hidden", "derived"]


def test_a_database_binned_without_the_flag_is_refused_in_one_line(real_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    shutil.copy(real_db, db)
    with duckdb.connect(str(db)) as c:  # layernorm's regions as an optwin before the flag binned them: 3 bins
        c.execute(r"UPDATE fingerprints SET region = regexp_replace(region, '\|[^|]*$', '') WHERE op = 'layernorm'")
    at = explorer(db)
    assert len(at.error) == 1, [e.value for e in at.error]
    line = at.error[0].value
    assert "\n" not in line and "layernorm" in line and "binned on other region features" in line
    assert "optwin build" in line and str(db) in line
    # nothing made up: no probabilities, no region table with a const_odd_width of 0
    assert "P(fault), matcher" not in metrics(at) and not [d for d in at.dataframe if "const_odd_width" in d.value]
    (build_id,) = direct(db, "SELECT build_id FROM builds")[0]
    assert open_data(db).binning_errors(str(build_id)) == [line]
    assert open_data(real_db).binning_errors(str(build_id)) == []


def test_compare_names_the_refused_op_and_keeps_the_others(tmp_path: Path) -> None:
    # two builds of rmsnorm and softmax; build-1's softmax regions lose a bin, as an older catalog's would
    db = make_db(tmp_path / "fp.duckdb")
    with duckdb.connect(str(db)) as c:
        c.execute(r"UPDATE fingerprints SET region = regexp_replace(region, '\|[^|]*$', '') "
                  "WHERE op = 'softmax' AND build_id = 'build-1'")
    at = app(db, "pages/5_Compare_builds.py")
    assert len(at.error) == 1, [e.value for e in at.error]
    assert "softmax (build build-1)" in at.error[0].value and "rmsnorm" not in at.error[0].value
    diff = open_data(db).compare("build-1", "build-2")
    # one refused op no longer blanks the served probabilities of the others
    both = diff[diff["status"].isin(["same", "changed"])]
    assert both[both["op"] == "rmsnorm"]["p_matcher_a"].notna().all() and (both["op"] == "rmsnorm").any()
    assert diff[diff["op"] == "softmax"]["p_matcher_a"].isna().all()
