"""Overview's "Operators covered" counts regions as the Regions headline and the Explorer do: regions with
fingerprints, which are made of the non-held-out cases only.

    python -m pytest -x -q tests/test_dashboard_regions_count.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_dashboard_fixture import direct, make_db
from test_dashboard_pages import app, metrics


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_db(tmp_path_factory.mktemp("regions") / "fp.duckdb", n_builds=1, n_cases=60)


def test_operators_covered_counts_fingerprinted_regions(db: Path) -> None:
    want = {(o, v, t): n for o, v, t, n in direct(
        db, "SELECT op, variant, dtype, count(DISTINCT region) FROM fingerprints GROUP BY ALL")}
    with_held_out = direct(db, "SELECT count(DISTINCT op||variant||dtype||'/'||region) FROM cases")[0][0]
    assert with_held_out > sum(want.values())  # else the test could not tell the two counts apart
    at = app(db)
    ops = next(d.value for d in at.dataframe if "n_held_out" in d.value.columns)  # the ov_ops table
    got = {(r.op, r.variant, r.dtype): int(r.n_regions) for r in ops.itertuples()}
    assert got == want
    assert sum(got.values()) == int(metrics(at)["Regions"])
