"""The Cases page draws its precision_loss threshold at the tolerances the case's build used.

    python -m pytest -q tests/test_s48_dashboard_case_tolerances.py

It drew the default tolerances' threshold whatever the build: a build run with precision_loss_ulps=64 flags a
case only above 64 u, yet the line sat at 16 u, under errors the build did not call faults. A real build with
non-default tolerances (they are recorded in builds.flags), and copies of its database whose flags lack them (a
database from before builds recorded them) or hold ones that do not read: there the page falls back to the
defaults and says so.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from optwin.catalog import DEFAULT_TOLERANCES, UNIT_ROUNDOFF
from optwin.fingerprints.build import BuildConfig, build
from test_dashboard_fixture import direct
from test_dashboard_pages import app

ULPS = 64.0  # the build's precision_loss_ulps; the default is 16


@pytest.fixture(scope="module")
def real_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tol") / "fp.duckdb"
    build(BuildConfig(out=str(out), ops=("rmsnorm",), quick=True, cases=6, replays=4, seed=0, workers=1,
                      include_triton=False, tolerances={"precision_loss_ulps": ULPS}))
    return out


def drawn_tau(at) -> float:
    """The y of the red rule in the Cases page's error chart, read from the chart's own data."""
    (chart,) = at.get("vega_lite_chart")
    spec = json.loads(chart.proto.spec)
    (rule,) = [layer for layer in spec["layer"] if layer["mark"]["type"] == "rule"]
    data = {d.name: d.data.data for d in chart.proto.datasets}[rule["data"]["name"]]
    return pa.ipc.open_stream(data).read_all().column("tau").to_pylist()[0]


def cases_page(db: Path):
    at = app(db, "pages/3_Cases.py")
    at.selectbox(key="cs_variant").set_value("native-dtype").run()  # the triple that faults in a quick build
    at.selectbox(key="cs_dtype").set_value("float16").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="cs_case").value is not None, "the build has no failing case to draw"
    return at


def test_the_threshold_is_the_builds(real_db: Path) -> None:
    recorded = json.loads(direct(real_db, "SELECT flags FROM builds")[0][0])["tolerances"]
    assert recorded["precision_loss_ulps"] == ULPS != DEFAULT_TOLERANCES.precision_loss_ulps
    at = cases_page(real_db)
    tau = ULPS * UNIT_ROUNDOFF["float16"]
    assert drawn_tau(at) == pytest.approx(tau)
    assert any(f"precision_loss threshold {tau:.3e}" in c.value and "tolerances" in c.value for c in at.caption)
    assert not at.warning


@pytest.mark.parametrize("flags_tolerances, why", [(None, "recorded no tolerances"),
                                                   ({"precision_loss_ulps": "many"}, "do not read")])
def test_a_build_without_readable_tolerances_falls_back_to_the_defaults_and_says_so(
        real_db: Path, tmp_path: Path, flags_tolerances, why) -> None:
    db = tmp_path / "old.duckdb"
    shutil.copy(real_db, db)
    with duckdb.connect(str(db)) as c:
        (flags,) = c.execute("SELECT flags FROM builds").fetchone()
        flags = json.loads(flags)
        if flags_tolerances is None:
            del flags["tolerances"]
        else:
            flags["tolerances"] = flags_tolerances
        c.execute("UPDATE builds SET flags = ?", [json.dumps(flags)])
    at = cases_page(db)
    tau = DEFAULT_TOLERANCES.precision_tau("rmsnorm", "float16")
    assert drawn_tau(at) == pytest.approx(tau)
    assert len(at.warning) == 1 and why in at.warning[0].value and "default tolerances" in at.warning[0].value
    assert f"{tau:.3e}" in at.warning[0].value
