"""A small real fingerprint database for the dashboard tests, and tests of the dashboard's data layer.

    python -m pytest -x -q tests/test_dashboard_fixture.py

`make_db` writes synthetic but contract-shaped shard files (the Parquet layout of
optwin.fingerprints.shards) and gathers them with the real store (`open_store(...).add_build`), so
fingerprints, Wilson intervals and representatives come from the production aggregation SQL. The
outcomes follow a seeded logistic boundary in log2(absmax), so pages have a boundary to find.
"""

from __future__ import annotations

import json
import math
import os
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from optwin.catalog import operator
from optwin.dashboard.data import boundary, file_identity, open_data, pool
from optwin.errors import DatabaseError, SchemaVersionError
from optwin.fingerprints.regions import region_key, region_of
from optwin.fingerprints.shards import SHARD_SCHEMA_SQL, is_held_out, stable_hash
from optwin.fingerprints.migrations import SCHEMA_VERSION
from optwin.fingerprints.stats import wilson
from optwin.fingerprints.store import open_store
from optwin.twin import TWIN_VERSION

_PA = {"BIGINT": pa.int64(), "INTEGER": pa.int32(), "VARCHAR": pa.string(), "BOOLEAN": pa.bool_(), "DOUBLE": pa.float64()}
SHARD_SCHEMA = pa.schema([(c, _PA[t]) for c, t in SHARD_SCHEMA_SQL])

# (op, variant, dtype, steepness): how sharply faults rise past the boundary
TRIPLES = (
    ("rmsnorm", "fp32-acc", "float16", 0.6),
    ("rmsnorm", "native-dtype", "float16", 2.0),
    ("softmax", "torch", "float16", 1.0),
)
REPLAYS = 16


def _sketch(op: str, rng: np.random.Generator) -> dict[str, float]:
    if op == "rmsnorm":
        hidden = float(rng.choice([64, 256, 1024]))
        absmax = float(2.0 ** rng.uniform(-2, 16))
        return {"absmax": absmax, "max_row_rms": absmax / float(rng.uniform(2, 8)), "hidden": hidden,
                "numel": 4 * hidden, "rows": 4.0, "rms": absmax / 8, "nonfinite": 0.0, "weight_absmax": 1.0}
    n = float(rng.choice([32, 128]))
    top = float(2.0 ** rng.uniform(-1, 12))
    return {"max": top, "max_row_range": top * float(rng.uniform(0.5, 2)), "masked_rows": float(rng.integers(0, 2)),
            "n": n, "min": -top, "masked_frac": 0.0, "numel": 4 * n, "rows": 4.0, "absmax": top, "rms": top / 4,
            "nonfinite": 0.0, "peaked_frac": float(rng.integers(0, 5)) / 4, "min_row_max": top - float(rng.uniform(0, 30))}


def _rows(build_seed: int, n_cases: int, shift: float) -> list[dict]:
    """Case+outcome rows of every triple; `shift` moves the boundary (to make builds differ)."""
    rows = []
    for op, variant, dtype, steep in TRIPLES:
        spec = operator(op)
        feats = spec.region_features
        shard = f"{op}/{variant}/{dtype}/default/0"
        for i in range(n_cases):
            rng = np.random.default_rng([7, i, len(op)])  # same inputs for every variant and build
            sk = _sketch(op, rng)
            drive = math.log2(1 + sk["absmax"] if op == "rmsnorm" else 1 + sk["max_row_range"])
            p = 1.0 / (1.0 + math.exp(-steep * (drive - (12.0 + shift))))
            rr = np.random.default_rng([build_seed, i, len(op), len(variant)])
            k_prec = int(rr.binomial(REPLAYS, p))
            k_nan = REPLAYS if sk["absmax"] > 6.0e4 and variant == "native-dtype" else 0
            errs = np.sort(2.0 ** (-11 + 6 * p + rr.normal(0, 0.5, REPLAYS)))
            row = {
                "case_id": stable_hash("case", build_seed, op, variant, dtype, "default", 7, i),
                "op": op, "variant": variant, "dtype": dtype, "source": "default",
                "family": "boundary:heavy" if i % 3 == 0 else "normal", "seed": 7, "case_index": i, "shard": shard,
                "region": region_key(region_of(op, sk)), "sketch": json.dumps(sk), "params": json.dumps({}),
                "held_out": is_held_out(op, dtype, "default", 7, i), "replays": REPLAYS, "noise": "stochastic",
                "det_nonfinite": k_nan > 0, "det_precision_loss": p > 0.5,
                "det_low_entropy": (p > 0.8) if "low_entropy" in spec.fault_types else None,
                "n_nonfinite": k_nan, "n_precision_loss": k_prec,
                "n_low_entropy": int(rr.binomial(REPLAYS, p * 0.5)) if "low_entropy" in spec.fault_types else None,
                "det_rel_error": float(errs[0]), "err_q50": float(errs[REPLAYS // 2 - 1]),
                "err_q90": float(errs[math.ceil(0.9 * REPLAYS) - 1]), "err_max": float(errs[-1]),
            }
            for j in range(4):
                row[f"f{j}"] = float(sk[feats[j]]) if j < len(feats) else None
            rows.append(row)
    return rows


def make_db(path: Path, n_builds: int = 2, n_cases: int = 60) -> Path:
    """Write a database with `n_builds` builds into a new file and swap it in at `path` (os.replace),
    the way `optwin build` does. Build k is 'build-k', created k hours after a fixed time."""
    path = Path(path)
    tmp = path.with_name(path.name + ".new")
    if tmp.exists():
        tmp.unlink()
    t0 = datetime(2025, 1, 1, 12, 0, 0)
    with open_store(str(tmp), read_only=False, create=True) as store:
        for k in range(1, n_builds + 1):
            shard = path.with_name(f"{path.stem}-shard-{k}.parquet")
            rows = _rows(100 + k, n_cases + 10 * (k - 1), shift=-1.0 * (k - 1))
            pq.write_table(pa.Table.from_pylist(rows, schema=SHARD_SCHEMA), shard)
            flags = {"ops": sorted({t[0] for t in TRIPLES}), "replays": REPLAYS, "noise": "stochastic",
                     "quick": True, "engine": "local"}
            store.add_build({"build_id": f"build-{k}", "created_at": t0 + timedelta(hours=k),
                             "code_version": f"test-{k}", "twin_version": TWIN_VERSION, "seed": 100 + k,
                             "flags": json.dumps(flags), "profile": None, "replays": REPLAYS, "noise": "stochastic",
                             "engine": "local", "duration_s": 1.5 * k}, [str(shard)])
            shard.unlink()
        store.checkpoint()
    os.replace(tmp, path)
    return path


def direct(path: Path, sql: str, params: list | None = None) -> list[tuple]:
    """A query straight on the file with DuckDB (the tests' independent check of what pages show)."""
    conn = duckdb.connect(":memory:")
    try:
        conn.execute(f"ATTACH '{path}' AS d (READ_ONLY)")
        conn.execute("USE d")
        return conn.execute(sql, params or []).fetchall()
    finally:
        conn.close()


def served(path: Path, build: str) -> dict[tuple[str, str, str, str, str], float]:
    """(op, variant, dtype, region, fault_type) -> what the real matcher of that build serves for the cell
    (`Matcher.open`, `TripleIndex.lookup`): the tests' independent check of the dashboard's p_matcher."""
    from optwin.fingerprints.matcher import Matcher
    from optwin.fingerprints.regions import parse_region_key

    m = Matcher.open(path, build_id=build)
    return {(*t, reg, ft): ti.lookup(parse_region_key(reg), m.config)[0][ti.fault_types.index(ft)]
            for t, ti in m.index.items()
            for (reg,) in direct(path, "SELECT DISTINCT region FROM fingerprints WHERE build_id = ? AND op = ? AND "
                                       "variant = ? AND dtype = ?", [build, *t])
            for ft in ti.fault_types}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_db(tmp_path_factory.mktemp("dash") / "fp.duckdb")


def test_fixture_is_a_real_v1_database(db: Path) -> None:
    assert direct(db, "SELECT value FROM schema_meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
    n_fp = direct(db, "SELECT count(*) FROM fingerprints WHERE build_id = 'build-2'")[0][0]
    n_rep = direct(db, "SELECT count(*) FROM representatives WHERE build_id = 'build-2'")[0][0]
    assert n_fp > 20 and n_rep > 5


def test_builds_newest_first_and_totals_match_sql(db: Path) -> None:
    d = open_data(db)
    assert list(d.builds()["build_id"]) == ["build-2", "build-1"]
    assert d.current_build() == "build-2"
    t = d.totals("build-2")
    cases, replays = direct(db, "SELECT count(*), sum(replays) FROM cases JOIN outcomes USING (build_id, case_id) "
                                "WHERE build_id = ?", ["build-2"])[0]
    assert (t["cases"], t["replays"], t["ops"]) == (cases, replays, 2)
    ops = d.ops_covered("build-2")
    assert int(ops["n_cases"].sum()) == cases
    ft = d.fault_totals("build-2").set_index("fault_type")
    assert ft.loc["precision_loss", "faulting_replays"] == direct(
        db, "SELECT sum(n_precision_loss) FROM outcomes WHERE build_id = 'build-2'")[0][0]
    assert ft.loc["low_entropy", "applicable_cases"] == direct(
        db, "SELECT count(*) FROM cases WHERE build_id = 'build-2' AND op = 'softmax'")[0][0]


def test_pool_matches_counts_and_wilson(db: Path) -> None:
    d = open_data(db)
    fp = d.fingerprints("build-2", "rmsnorm", "native-dtype", "float16", "precision_loss")
    k, n, cases = direct(db, "SELECT sum(n_faults), sum(n_replays), sum(n_cases) FROM fingerprints WHERE build_id = 'build-2' AND "
                      "op = 'rmsnorm' AND variant = 'native-dtype' AND fault_type = 'precision_loss'")[0]
    p = pool(fp.assign(all=1), ["all"]).iloc[0]
    assert (p.n_faults, p.n_replays) == (k, n)
    assert p.probability == pytest.approx(k / n)
    assert (p.ci_low, p.ci_high) == pytest.approx(wilson(k, n, n_eff=cases))
    curve = pool(fp, ["bin:absmax", "absmax"])
    edge = boundary(curve, "absmax", 0.5)
    # the synthetic boundary sits near log2(1 + absmax) = 11 for build-2 (shift -1)
    assert edge is not None and 2.0**9 <= edge <= 2.0**12.5
    assert curve["probability"].iloc[0] < 0.1 < 0.9 < curve["probability"].iloc[-1]


def test_compare_statuses(db: Path) -> None:
    d = open_data(db)
    diff = d.compare("build-1", "build-2")
    counts = diff["status"].value_counts().to_dict()
    a = direct(db, "SELECT count(*) FROM fingerprints WHERE build_id = 'build-1'")[0][0]
    b = direct(db, "SELECT count(*) FROM fingerprints WHERE build_id = 'build-2'")[0][0]
    assert counts.get("removed", 0) + counts.get("changed", 0) + counts.get("same", 0) == a
    assert counts.get("new", 0) + counts.get("changed", 0) + counts.get("same", 0) == b
    assert counts.get("changed", 0) > 0
    regions = d.region_changes("build-1", "build-2")
    assert set(regions["status"]) <= {"new", "removed"}


def test_compare_calls_nan_on_both_sides_same(tmp_path: Path) -> None:
    """A cell NaN in both builds is unchanged (NaN != NaN called every such cell "changed"); NaN on one side only
    is a change. Build-2 is a copy of build-1; softmax's regions carry a fourth coordinate in both (binned by
    another catalog: the matcher serves neither, p_matcher NaN), and one cell has no replay rate (NULL)."""
    path = make_db(tmp_path / "fp.duckdb", n_builds=1, n_cases=20)
    conn = duckdb.connect(str(path))
    try:
        conn.execute("INSERT INTO builds SELECT * REPLACE ('build-2' AS build_id) FROM builds")
        conn.execute("INSERT INTO fingerprints SELECT * REPLACE ('build-2' AS build_id) FROM fingerprints")
        conn.execute("UPDATE fingerprints SET region = region || '|0' WHERE op = 'softmax'")
        key = conn.execute("SELECT DISTINCT region, fault_type FROM fingerprints WHERE op = 'softmax' ORDER BY region, "
                           "fault_type LIMIT 2").fetchall()
        conn.execute("UPDATE fingerprints SET probability = NULL WHERE op = 'softmax' AND region = ? AND fault_type = ?",
                     list(key[0]))
        conn.execute("UPDATE fingerprints SET probability = NULL WHERE op = 'softmax' AND region = ? AND fault_type = ? "
                     "AND build_id = 'build-2'", list(key[1]))
    finally:
        conn.close()
    diff = open_data(path).compare("build-1", "build-2", op="softmax").set_index(["region", "fault_type"])
    assert diff["p_matcher_a"].isna().all() and diff["p_matcher_b"].isna().all()
    assert diff.loc[key[0], ["p_replays_a", "p_replays_b"]].isna().all() and diff.loc[key[0], "status"] == "same"
    assert diff.loc[key[1], "status"] == "changed"
    assert (diff.drop(index=[key[1]])["status"] == "same").all()


def test_case_detail_and_representatives(db: Path) -> None:
    d = open_data(db)
    reps = d.representatives("build-2", "rmsnorm", "native-dtype", "float16", "precision_loss")
    assert len(reps) > 0 and reps["rel_error"].is_monotonic_decreasing
    c = d.case("build-2", int(reps["case_id"].iloc[0]))
    assert c is not None and c.row["op"] == "rmsnorm" and "absmax" in c.sketch
    assert d.case("build-2", -1) is None


def test_missing_foreign_and_wrong_version_files(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="no fingerprint database"):
        open_data(tmp_path / "nope.duckdb")
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"definitely not duckdb\n" * 50)
    with pytest.raises(DatabaseError):
        open_data(junk)
    other = tmp_path / "other.duckdb"
    c = duckdb.connect(str(other))
    c.execute("CREATE TABLE schema_meta(key VARCHAR PRIMARY KEY, value VARCHAR)")
    c.execute("INSERT INTO schema_meta VALUES ('schema_version', '99')")
    c.close()
    with pytest.raises(SchemaVersionError, match="optwin migrate"):
        open_data(other)


def test_reopen_sees_the_replaced_file(tmp_path: Path) -> None:
    path = make_db(tmp_path / "fp.duckdb", n_builds=1, n_cases=20)
    old = open_data(path)
    ident = file_identity(path)
    make_db(path, n_builds=3, n_cases=20)
    assert file_identity(path) != ident
    assert len(old.builds()) == 1  # the old snapshot keeps working
    assert len(open_data(path).builds()) == 3
