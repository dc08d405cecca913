"""The Cases page's "Reproduce" snippet, run as shown, replays the stored case as the build did.

    python -m pytest -x -q tests/test_dashboard_snippet_replay.py

A small real build (geodesic: cheap, and many of its cases fault in some replays only; a non-default tolerance); for each stored case the snippet's
replay fault counts must equal the stored ones. They do only with the build's replay seed
(case_id % 2**31, not the generator's seed) and the build's tolerances.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from optwin.dashboard.data import open_data
from optwin.dashboard.snippet import reproduce_snippet
from optwin.fingerprints.build import BuildConfig, build
from test_dashboard_fixture import direct
from test_dashboard_pages import app

FAULTS = ("nonfinite", "precision_loss")


@pytest.fixture(scope="module")
def noisy_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("snip") / "fp.duckdb"
    # geodesic_rel 2e-3 (default 1e-3): a snippet on the default tolerances counts other faults
    build(BuildConfig(out=str(out), ops=("geodesic",), quick=True, cases=16, replays=24, seed=3, workers=1,
                      tolerances={"geodesic_rel": 2e-3}, include_triton=False))
    return out


def _run(code: str) -> dict:
    ns: dict = {}
    exec(compile(code, "<snippet>", "exec"), ns)  # the snippet as a user would paste it
    return {k: int(v.sum()) for k, v in ns["res"].replay_faults.items()}


def test_snippet_replays_give_the_stored_fault_counts(noisy_db: Path) -> None:
    d = open_data(noisy_db)
    b = d.current_build()
    flags = d.build_flags(b)
    assert flags["tolerances"]["geodesic_rel"] == 2e-3
    # cases whose replays neither all fault nor all pass: only there do the replay seed and tolerances show
    rows = direct(noisy_db, "SELECT case_id, n_nonfinite, n_precision_loss FROM outcomes WHERE build_id = ? AND "
                            "(n_nonfinite BETWEEN 1 AND replays - 1 OR n_precision_loss BETWEEN 1 AND replays - 1) "
                            "ORDER BY case_id LIMIT 4", [b])
    assert rows, "the build has no mixed case to compare"
    for case_id, n_nf, n_pl in rows:
        code = reproduce_snippet(d.case(b, case_id).row, flags)
        got = _run(code)
        assert (got["nonfinite"], got["precision_loss"]) == (n_nf, n_pl), code
    d.close()


def test_cases_page_snippet_carries_the_build_replay(noisy_db: Path) -> None:
    at = app(noisy_db, "pages/3_Cases.py")
    case_id = at.selectbox(key="cs_case").value
    code = at.code[0].value
    assert f"seed={case_id % 2**31})" in code and "'geodesic_rel': 0.002" in code
