"""The dashboard over a database made by the real builder (`optwin build --quick --ops rmsnorm`, small).

    python -m pytest -x -q tests/test_dashboard_real_build.py

Two real builds (seeds 0 and 1) into one file; the pages must render them, and the Cases page's
snippet, run as shown, must regenerate the stored case: same region, same deterministic faults.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optwin.fingerprints.build import BuildConfig, build
from optwin.fingerprints.regions import region_key, region_of
from test_dashboard_fixture import direct
from test_dashboard_pages import app, metrics


@pytest.fixture(scope="module")
def real_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("real") / "fp.duckdb"
    for seed in (0, 1):
        build(BuildConfig(out=str(out), ops=("rmsnorm",), quick=True, cases=6, replays=4, seed=seed,
                          include_triton=False))
    return out


def test_overview_and_compare_on_a_real_build(real_db: Path) -> None:
    at = app(real_db)
    cases, replays = direct(real_db, "SELECT n_cases, n_replays FROM builds ORDER BY created_at DESC LIMIT 1")[0]
    m = metrics(at)
    assert (m["Builds"], m["Operators"], m["Cases"], m["Replays"]) == ("2", "1", str(cases), str(replays))
    at = app(real_db, "pages/5_Compare_builds.py")
    total = sum(int(v) for k, v in metrics(at).items() if k.startswith("Fingerprints "))
    both = direct(real_db, "SELECT count(*) FROM (SELECT DISTINCT op, variant, dtype, region, fault_type FROM fingerprints)")[0][0]
    assert total == both


def test_explorer_on_a_real_build(real_db: Path) -> None:
    at = app(real_db, "pages/2_Operator_explorer.py")
    at.selectbox(key="ex_variant").set_value("native-dtype").run()
    at.selectbox(key="ex_dtype").set_value("float16").run()
    at.selectbox(key="ex_fault").set_value("precision_loss").run()
    assert not at.exception
    n = direct(real_db, "SELECT sum(n_replays) FROM fingerprints WHERE build_id = (SELECT build_id FROM builds ORDER BY "
                        "created_at DESC LIMIT 1) AND variant = 'native-dtype' AND dtype = 'float16' "
                        "AND fault_type = 'precision_loss'")[0][0]
    assert metrics(at)["Replays"] == str(n)


def test_cases_snippet_reproduces_the_stored_case(real_db: Path) -> None:
    at = app(real_db, "pages/3_Cases.py")
    assert not at.exception
    at.selectbox(key="cs_variant").set_value("native-dtype").run()  # the triple that faults in a quick build
    at.selectbox(key="cs_dtype").set_value("float16").run()
    case_id = at.selectbox(key="cs_case").value
    code = at.code[0].value
    ns: dict = {}
    exec(compile(code, "<snippet>", "exec"), ns)  # the snippet as a user would paste it
    res, inputs, params = ns["res"], ns["inputs"], ns["params"]
    bid = at.selectbox(key="build").value
    region, sketch, det_nf, det_pl = direct(
        real_db, "SELECT c.region, c.sketch, o.det_nonfinite, o.det_precision_loss FROM cases c JOIN outcomes o "
                 "USING (build_id, case_id) WHERE build_id = ? AND case_id = ?", [bid, case_id])[0]
    from optwin.ingest import sketch as make_sketch

    again = make_sketch("rmsnorm", inputs, params)
    assert region_key(region_of("rmsnorm", again)) == region
    assert again == pytest.approx(json.loads(sketch))
    assert (res.faults["nonfinite"], res.faults["precision_loss"]) == (det_nf, det_pl)
