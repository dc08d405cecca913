"""Schema versioning of the fingerprint database on real DuckDB files: create, refuse, migrate, snapshot reads.

    python -m pytest -q tests/test_store_migrations.py
"""

from __future__ import annotations

import os
import shutil

import duckdb
import pytest
from typer.testing import CliRunner

from optwin.errors import DatabaseError, SchemaVersionError
from optwin.fingerprints.migrations import SCHEMA_VERSION, detect_version
from optwin.fingerprints.migrations.v0001_initial import TABLES, V0_LAYOUT
from optwin.fingerprints.stats import wilson
from optwin.fingerprints.store import migrate_database, open_store


# v0001 created these columns; v0002 appended det_faults to fingerprints.
EXPECTED = {t: [c for c, _, _ in cols] + (["det_faults"] if t == "fingerprints" else []) for t, cols in TABLES.items()}


def _columns(path: str, table: str) -> list[str]:
    with duckdb.connect(path, read_only=True) as c:
        return [r[0] for r in c.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                                         "ORDER BY ordinal_position", [table]).fetchall()]


def _set_version(path: str, value: str) -> None:
    with duckdb.connect(path) as c:
        c.execute("UPDATE schema_meta SET value = ? WHERE key = 'schema_version'", [value])


def _make_v0(path: str) -> None:
    with duckdb.connect(path) as c:
        for ddl in V0_LAYOUT:
            c.execute(ddl)
        c.execute("INSERT INTO builds VALUES ('old', TIMESTAMP '2024-01-02 03:04:05', 7, '{}', 4, 'stochastic', 2)")
        c.execute("INSERT INTO cases VALUES ('old', 1, 'rmsnorm', 'native-dtype', 'float16', 'default', 7, 0, '1|1|5', "
                  "'{\"absmax\": 2.0}', '{}'), ('old', 2, 'rmsnorm', 'native-dtype', 'float16', 'default', 7, 1, '1|1|5', "
                  "'{\"absmax\": 3.0}', '{}')")
        c.execute("INSERT INTO outcomes VALUES ('old', 1, 4, 'stochastic', false, true, NULL, 0, 3, NULL, 0.1, 0.1, 0.2, 0.3), "
                  "('old', 2, 4, 'stochastic', false, false, NULL, 0, 0, NULL, 0.0, 0.0, 0.0, 0.0)")
        c.execute("INSERT INTO fingerprints VALUES ('old', 'rmsnorm', 'native-dtype', 'float16', '1|1|5', 'precision_loss', "
                  "2, 8, 3, 0.375)")


def test_empty_file_is_created_at_current_version_with_contract_tables(tmp_path):
    path = str(tmp_path / "new.duckdb")
    with open_store(path, read_only=False, create=True) as s:
        assert s.schema_version() == SCHEMA_VERSION == 3
        assert s.builds() == [] and s.latest_build_id() is None and s.fingerprints() == []
    with duckdb.connect(path, read_only=True) as c:
        assert c.execute("SELECT value FROM schema_meta WHERE key = 'schema_version'").fetchall() == [("3",)]
    for table, cols in EXPECTED.items():
        assert _columns(path, table) == cols, table
    with open_store(path) as s:  # and a read-only open now works
        assert s.schema_version() == 3


@pytest.mark.parametrize("version", ["0", "1", "2", "4"])
def test_other_schema_versions_are_refused_with_migrate_hint(tmp_path, version):
    path = str(tmp_path / "fp.duckdb")
    open_store(path, read_only=False, create=True).close()
    _set_version(path, version)
    for read_only in (True, False):
        with pytest.raises(SchemaVersionError, match=r"schema version %s, this optwin reads 3.*optwin migrate" % version):
            open_store(path, read_only=read_only)
    assert "\n" not in str(pytest.raises(SchemaVersionError, open_store, path).value)


def test_newer_version_is_not_downgraded_by_migrate(tmp_path):
    path = str(tmp_path / "fp.duckdb")
    open_store(path, read_only=False, create=True).close()
    _set_version(path, "4")
    with pytest.raises(SchemaVersionError, match="optwin migrate"):
        migrate_database(path)
    with duckdb.connect(path, read_only=True) as c:  # untouched
        assert detect_version(c) == 4


def test_migrate_upgrades_a_v0_database_and_keeps_its_rows(tmp_path):
    path = str(tmp_path / "v0.duckdb")
    _make_v0(path)
    with pytest.raises(SchemaVersionError, match="schema version 0.*optwin migrate"):
        open_store(path)
    result = CliRunner().invoke(_app(), ["migrate", path])
    assert result.exit_code == 0, result.output
    assert "0 -> 3" in result.output
    with open_store(path) as s:
        assert s.schema_version() == 3
        assert [b["build_id"] for b in s.builds()] == ["old"]
        assert s.builds()[0]["n_replays"] == 8  # filled from outcomes
        (fp,) = s.fingerprints("old")
        lo, hi = wilson(3, 8, n_eff=2)  # v0003: 2 cases are the sample, not their 8 replays
        assert fp["ci_low"] == pytest.approx(lo, abs=1e-12) and fp["ci_high"] == pytest.approx(hi, abs=1e-12)
        assert fp["det_faults"] == 1  # v0002: case 1's deterministic emulation lost precision, case 2's did not
        assert {c["held_out"] for c in s.cases("old")} == {False}
        assert s.representatives("old") == []
    for table, cols in EXPECTED.items():
        assert set(_columns(path, table)) == set(cols), table
    assert migrate_database(path) == (3, 3)  # idempotent
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_missing_and_corrupt_files_are_one_line_database_errors(tmp_path):
    with pytest.raises(DatabaseError, match="no fingerprint database at .*optwin build"):
        open_store(str(tmp_path / "nope.duckdb"))
    bad = tmp_path / "bad.duckdb"
    bad.write_bytes(os.urandom(5000))
    with pytest.raises(DatabaseError) as e:
        open_store(str(bad))
    assert "\n" not in str(e.value) and str(bad) in str(e.value)
    with pytest.raises(DatabaseError, match="no fingerprint database"):
        migrate_database(str(tmp_path / "nope.duckdb"))


def _add(path: str, build_id: str) -> None:
    with open_store(path, read_only=False, create=True) as s:
        s.add_build({"build_id": build_id, "created_at": __import__("datetime").datetime(2025, 1, 1 + len(s.builds())),
                      "seed": 0, "flags": "{}", "replays": 0, "noise": "none", "engine": "local", "duration_s": 0.0}, [])


def test_read_only_store_is_a_snapshot_across_atomic_replace(tmp_path):
    path, new = str(tmp_path / "fp.duckdb"), str(tmp_path / "next.duckdb")
    _add(path, "first")
    reader = open_store(path)
    assert reader.latest_build_id() == "first"
    shutil.copyfile(path, new)
    _add(new, "second")
    os.replace(new, path)  # what a build does
    fresh = open_store(path)
    assert fresh.latest_build_id() == "second" and len(fresh.builds()) == 2
    assert reader.latest_build_id() == "first" and len(reader.builds()) == 1  # old file keeps working
    reader.close()
    fresh.close()
    reader.close()  # idempotent
    with pytest.raises(DatabaseError, match="closed"):
        reader.builds()


def _app():
    import typer

    from optwin.fingerprints.cli import build_command, migrate_command

    app = typer.Typer()
    app.command("build")(build_command)
    app.command("migrate")(migrate_command)
    return app


def test_arrow_reads_work_as_the_first_query_of_a_fresh_store(tmp_path):
    path = str(tmp_path / "fp.duckdb")
    _add(path, "only")
    for method in ("builds", "fingerprints", "cases", "outcomes", "representatives", "held_out_cases"):
        with open_store(path) as s:  # fresh: nothing may be left unfinished on the connection by open
            table = getattr(s, method)(as_arrow=True)
            assert table.num_rows == len(getattr(s, method)()), method
            assert s.latest_build_id() == "only"


def test_migrate_refuses_a_file_that_is_not_duckdb_and_leaves_it(tmp_path):
    """The error names the file itself (not migrate's private copy) and the file is unchanged."""
    path = tmp_path / "notes.duckdb"
    path.write_bytes(b"not a database, just text\n" * 4)
    with pytest.raises(DatabaseError, match=r"notes.duckdb: not a DuckDB file") as err:
        migrate_database(str(path))
    assert ".tmp-" not in str(err.value)
    assert path.read_bytes() == b"not a database, just text\n" * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.duckdb"]  # no copy left behind


def test_another_applications_database_is_refused_and_left_as_it_was(tmp_path):
    import sqlite3
    import time

    other = str(tmp_path / "orders.duckdb")
    with duckdb.connect(other) as c:
        c.execute("CREATE TABLE orders(id INTEGER, total DOUBLE)")
        c.execute("INSERT INTO orders VALUES (1, 9.5)")
    for read_only in (True, False):  # read (matcher, sidecar) and write (a build's --out)
        with pytest.raises(DatabaseError, match="of something else .tables orders., not a fingerprint database") as e:
            open_store(other, read_only=read_only)
        assert not isinstance(e.value, SchemaVersionError)  # no "run optwin migrate" advice: it would add our tables
    with pytest.raises(DatabaseError, match="not a fingerprint database"):
        migrate_database(other)
    with duckdb.connect(other, read_only=True) as c:
        assert [r[0] for r in c.execute("SHOW TABLES").fetchall()] == ["orders"]
    lite = str(tmp_path / "app.sqlite")
    with sqlite3.connect(lite) as c:
        c.execute("CREATE TABLE t(x)")
    t0 = time.monotonic()
    with pytest.raises(DatabaseError, match="not a DuckDB file"):  # refused before DuckDB's SQLite scanner (a download)
        open_store(lite)
    assert time.monotonic() - t0 < 1.0


def test_migrate_to_v3_recomputes_intervals_over_cases(tmp_path):
    """v0003: a v2 file's intervals took each replay as a trial; migrated, they take the cell's cases, as a fresh build
    writes them (1 case of 8 clean replays: ci_high 0.32 -> 0.79)."""
    path = str(tmp_path / "v2.duckdb")
    open_store(path, read_only=False, create=True).close()
    old = [("b", "rmsnorm", "native-dtype", "float16", "1|1|5", "precision_loss", 1, 8, 0, 0.0, *wilson(0, 8)),
           ("b", "rmsnorm", "native-dtype", "float16", "1|1|6", "precision_loss", 4, 32, 12, 0.375, *wilson(12, 32))]
    with duckdb.connect(path) as c:
        c.executemany("INSERT INTO fingerprints (build_id, op, variant, dtype, region, fault_type, n_cases, n_replays, "
                      "n_faults, probability, ci_low, ci_high) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", old)
    _set_version(path, "2")
    assert migrate_database(path) == (2, 3)
    with duckdb.connect(path, read_only=True) as c:
        got = c.execute("SELECT n_faults, n_replays, n_cases, ci_low, ci_high FROM fingerprints ORDER BY region").fetchall()
    for k, n, cases, lo, hi in got:
        assert (lo, hi) == pytest.approx(wilson(k, n, n_eff=cases), abs=1e-12)
    assert got[0][4] == pytest.approx(0.7935, abs=1e-4) and got[0][4] > wilson(0, 8)[1] + 0.4


def _rows_by_name(path: str, table: str, build_id: str) -> list[dict]:
    with duckdb.connect(path, read_only=True) as c:
        cur = c.execute(f"SELECT * EXCLUDE (build_id) FROM {table} WHERE build_id = ? ORDER BY ALL", [build_id])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]


def test_a_migrated_v0_database_takes_a_new_build_with_rows_in_their_columns(tmp_path):
    """v0 -> v1 appended cases.family/shard/held_out after `params`, so the migrated file's column
    order differs from a fresh one's: a build into it must write by column name, and land exactly the
    rows a build into a fresh file writes (compared column by column, not by position)."""
    from optwin.fingerprints.build import BuildConfig, build

    cfg = dict(ops=("geodesic",), cases=4, replays=1, seed=3, workers=1)
    old, fresh = str(tmp_path / "v0.duckdb"), str(tmp_path / "fresh.duckdb")
    _make_v0(old)
    assert migrate_database(old) == (0, SCHEMA_VERSION)
    assert _columns(old, "cases") != EXPECTED["cases"]  # the appended columns really are out of order
    new_id = build(BuildConfig(out=old, **cfg)).build_id
    fresh_id = build(BuildConfig(out=fresh, **cfg)).build_id
    for table in ("cases", "outcomes", "fingerprints", "representatives"):
        got, want = _rows_by_name(old, table, new_id), _rows_by_name(fresh, table, fresh_id)
        assert got == want and (got or table == "representatives"), table
    cases = _rows_by_name(old, "cases", new_id)
    assert all(c["shard"].startswith("geodesic.") and isinstance(c["held_out"], bool) for c in cases)
    with open_store(old) as s:
        assert {b["build_id"] for b in s.builds()} == {"old", new_id}
        assert len(s.cases("old")) == 2  # the v0 build's rows are kept


def test_copy_for_write_never_replays_a_stale_wal_left_beside_its_target(tmp_path):
    """A writer killed mid-gather leaves `<copy>` and `<copy>.wal`; DuckDB replays a WAL it finds beside a file
    it opens, so a copy written over that name would come up holding the dead writer's rows. The copy removes
    both first, and temporary names are unique per call (not the pid, which a later process can reuse)."""
    import subprocess
    import sys

    from optwin.fingerprints.duckdb_store import copy_for_write, temp_path

    src, dst = str(tmp_path / "fp.duckdb"), str(tmp_path / "fp.duckdb.tmp-stale")
    _add(src, "first")
    shutil.copyfile(src, dst)
    killed = ("import duckdb, os, sys\n"
              "c = duckdb.connect(sys.argv[1])\n"
              "c.execute(\"INSERT INTO builds (build_id, created_at) VALUES ('stale', TIMESTAMP '2030-01-01')\")\n"
              "os._exit(9)  # no close, no checkpoint: the insert lives only in the WAL\n")
    subprocess.run([sys.executable, "-c", killed, dst], check=False, timeout=60)
    assert os.path.getsize(dst + ".wal") > 0
    copy_for_write(src, dst)
    assert not os.path.exists(dst + ".wal")
    with open_store(dst) as s:
        assert [b["build_id"] for b in s.builds()] == ["first"]
    assert temp_path(src) != temp_path(src) and temp_path(src).startswith(src + ".tmp-")


def _cli(args: list[str]):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "optwin.fingerprints.cli", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_migrate_takes_the_build_lock_and_leaves_a_current_file_alone(tmp_path):
    """`optwin migrate` swaps a copy onto the file, as a build does: while a build holds the database's lock it is
    refused (one `error:` line, file untouched), else a build finishing meanwhile would be undone by its swap. A file
    already at the current version is not copied or swapped at all (same inode, same bytes, no temporary)."""
    from optwin.fingerprints.build_lock import build_lock

    old = str(tmp_path / "v0.duckdb")
    _make_v0(old)
    before = (os.stat(old).st_ino, open(old, "rb").read())
    with build_lock(old):  # a build of this database, still running
        r = _cli(["migrate", old])
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
        assert r.stderr.startswith("error: ") and f"another build (pid {os.getpid()}) is writing it" in r.stderr
    assert (os.stat(old).st_ino, open(old, "rb").read()) == before
    assert _cli(["migrate", old]).returncode == 0  # the build ended: migrate goes ahead

    cur = str(tmp_path / "fp.duckdb")
    _add(cur, "only")
    st = os.stat(cur)
    r = _cli(["migrate", cur])
    assert r.returncode == 0 and f"already at schema version {SCHEMA_VERSION}" in r.stdout, r.stderr
    assert (os.stat(cur).st_ino, os.stat(cur).st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert sorted(os.listdir(tmp_path)) == ["fp.duckdb", "v0.duckdb"]  # no copy, no lock file left
    with build_lock(cur, "migrate"):  # and a build meeting a migrate says so
        r = _cli(["build", "--ops", "geodesic", "--cases", "2", "--out", cur])
        assert r.returncode == 2 and f"optwin migrate (pid {os.getpid()}) is writing it" in r.stderr, r.stderr
