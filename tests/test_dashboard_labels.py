"""The Explorer's and Cases page's numbers are labelled as what they count.

    python -m pytest -x -q tests/test_dashboard_labels.py

A build without noisy replays (`--replays 0`) fingerprints the deterministic emulation, one "replay" per
case: the Explorer calls those cases, not replays. The Cases page counts distinct cases, not case x fault rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from optwin.fingerprints.build import BuildConfig, build
from test_dashboard_fixture import direct
from test_dashboard_pages import app, metrics


def _geodesic_db(tmp_path_factory: pytest.TempPathFactory, cases: int, replays: int) -> Path:
    out = tmp_path_factory.mktemp(f"rep{replays}") / "fp.duckdb"
    build(BuildConfig(out=str(out), ops=("geodesic",), quick=True, cases=cases, replays=replays, seed=1, workers=1,
                      include_triton=False))
    return out


@pytest.fixture(scope="module")
def emulation_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _geodesic_db(tmp_path_factory, cases=8, replays=0)


@pytest.fixture(scope="module")
def noisy_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _geodesic_db(tmp_path_factory, cases=16, replays=8)


def test_explorer_on_a_build_without_replays_says_cases(emulation_db: Path) -> None:
    at = app(emulation_db, "pages/2_Operator_explorer.py")
    variant, dtype, fault = (at.selectbox(key=k).value for k in ("ex_variant", "ex_dtype", "ex_fault"))
    m = metrics(at)
    assert "Replays" not in m and "Faulting replays" not in m and "P(fault), replays" not in m
    n_cases = direct(emulation_db, "SELECT count(*) FROM cases WHERE variant = ? AND dtype = ? AND NOT held_out",
                     [variant, dtype])[0][0]
    assert m["Emulated cases"] == str(n_cases)
    k = direct(emulation_db, "SELECT sum(n_faults) FROM fingerprints WHERE variant = ? AND dtype = ? AND fault_type = ?",
               [variant, dtype, fault])[0][0]
    assert m["Faulting cases"] == str(k) and "P(fault), emulation" in m


def test_cases_counts_distinct_cases(noisy_db: Path) -> None:
    db = noisy_db
    at = app(db, "pages/3_Cases.py")
    at.selectbox(key="cs_variant").set_value("acos").run()  # some of its cases are non-finite and imprecise
    assert at.selectbox(key="cs_fault").value == "all fault types"
    rows, cases = direct(db, "SELECT count(*), count(DISTINCT case_id) FROM representatives WHERE op = 'geodesic' "
                             "AND variant = 'acos' AND dtype = 'float32'")[0]
    assert rows > cases  # else the test could not tell rows from cases
    assert metrics(at)["Representative failing cases"] == str(cases)


def test_explorer_on_a_build_with_replays_says_replays(noisy_db: Path) -> None:
    m = metrics(app(noisy_db, "pages/2_Operator_explorer.py"))
    assert {"Replays", "Faulting replays", "P(fault), replays"} <= set(m) and "Emulated cases" not in m


def test_explorer_on_a_build_with_no_recorded_replay_count_says_replays(noisy_db: Path, tmp_path: Path) -> None:
    # a build from before builds.replays existed (migrated: NULL) had noisy replays; NULL read as --replays 0
    import shutil

    import duckdb

    db = tmp_path / "old.duckdb"
    shutil.copy(noisy_db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE builds SET replays = NULL")
    m = metrics(app(db, "pages/2_Operator_explorer.py"))
    assert "Replays" in m and "Emulated cases" not in m
