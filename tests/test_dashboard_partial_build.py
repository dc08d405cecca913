"""The dashboard after a build of some ops into an existing database (`optwin build --ops rmsnorm`).

    python -m pytest -x -q tests/test_dashboard_partial_build.py

The newer build holds rmsnorm only; the matcher still serves softmax from the older one. Compare calls
softmax's cells "not rebuilt" (not removed), and the pages open on what the matcher serves: both ops.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from optwin.dashboard.data import SERVED, open_data
from optwin.fingerprints.store import open_store
from optwin.twin import TWIN_VERSION
from test_dashboard_fixture import REPLAYS, SHARD_SCHEMA, _rows, direct
from test_dashboard_pages import app, metrics


@pytest.fixture(scope="module")
def partial_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("partial") / "fp.duckdb"
    t0 = datetime(2025, 1, 1, 12)
    with open_store(str(path), read_only=False, create=True) as store:
        for k, ops in ((1, {"rmsnorm", "softmax"}), (2, {"rmsnorm"})):
            rows = [r for r in _rows(100 + k, 40, shift=-1.0 * (k - 1)) if r["op"] in ops]
            shard = path.with_name(f"shard-{k}.parquet")
            pq.write_table(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), shard)
            store.add_build({"build_id": f"build-{k}", "created_at": t0 + timedelta(hours=k), "code_version": "t",
                             "twin_version": TWIN_VERSION, "seed": 100 + k,
                             "flags": json.dumps({"ops": sorted(ops), "replays": REPLAYS}), "profile": None,
                             "replays": REPLAYS, "noise": "stochastic", "engine": "local", "duration_s": 1.0},
                            [str(shard)])
        store.checkpoint()
    return path


def test_compare_calls_ops_the_newer_build_skipped_not_rebuilt(partial_db: Path) -> None:
    d = open_data(partial_db)
    diff = d.compare("build-1", "build-2")
    assert set(diff.loc[diff.op == "softmax", "status"]) == {"not rebuilt"}
    assert set(diff.loc[diff.status == "removed", "op"]) <= {"rmsnorm"}
    regions = d.region_changes("build-1", "build-2")
    assert set(regions.loc[regions.op == "softmax", "status"]) == {"not rebuilt"}
    d.close()
    at = app(partial_db, "pages/5_Compare_builds.py")
    n_softmax = direct(partial_db, "SELECT count(*) FROM fingerprints WHERE build_id = 'build-1' AND op = 'softmax'")[0][0]
    assert metrics(at)["Fingerprints not rebuilt"] == str(n_softmax) and n_softmax > 0


def test_pages_open_on_what_the_matcher_serves(partial_db: Path) -> None:
    at = app(partial_db)
    assert at.selectbox(key="build").value == SERVED
    cases, replays = direct(partial_db, "SELECT count(*), sum(o.replays) FROM cases c JOIN outcomes o USING (build_id, case_id) "
                                        "WHERE (c.build_id = 'build-2') OR (c.build_id = 'build-1' AND c.op = 'softmax')")[0]
    m = metrics(at)
    assert (m["Operators"], m["Cases"], m["Replays"]) == ("2", str(cases), str(replays))
    at = app(partial_db, "pages/2_Operator_explorer.py")
    assert at.selectbox(key="ex_op").options == ["rmsnorm", "softmax"]
    at = app(partial_db, "pages/3_Cases.py")
    at.selectbox(key="cs_op").set_value("softmax").run()
    assert not at.exception
    assert "of build build-1" in at.code[0].value  # softmax's cases come from the build that replayed them
    # a picked build is still that build alone
    at = app(partial_db)
    at.selectbox(key="build").set_value("build-2").run()
    assert metrics(at)["Operators"] == "1"
