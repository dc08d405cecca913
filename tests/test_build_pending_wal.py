"""A `<db>.wal` left by a writer that died (its rows committed, not yet checkpointed) survives a build and a migrate.

    python -m pytest -q tests/test_build_pending_wal.py

The build and migrate write a copy of the database and swap it in. Copying the main file alone dropped the WAL's
rows, and the old WAL left beside the swapped-in file made DuckDB refuse the file ("WAL checkpoint iteration does
not match") after a build that had reported success.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import duckdb
import pytest

from optwin.errors import DatabaseError
from optwin.fingerprints.build import BuildConfig, build
from optwin.fingerprints.duckdb_store import fold_wal
from optwin.fingerprints.store import migrate_database, open_store
from _small_db import small_database

# A writer that commits a builds row and dies: no close, no checkpoint, so the row lives only in the WAL.
_DIE_WITH_WAL = ("import duckdb, os, sys\n"
                 "c = duckdb.connect(sys.argv[1])\n"
                 "c.execute(\"SET wal_autocheckpoint = '1TB'\")\n"
                 "c.execute(\"INSERT INTO builds (build_id, created_at) VALUES ('in-wal', TIMESTAMP '2020-01-01')\")\n"
                 "os._exit(0)\n")


def _leave_pending_wal(path: str) -> None:
    subprocess.run([sys.executable, "-c", _DIE_WITH_WAL, path], check=True, timeout=60)
    assert os.path.getsize(path + ".wal") > 0


def _build_ids(path: str) -> set[str]:
    with open_store(path) as s:  # what the matcher does: fails on a file DuckDB refuses
        return {b["build_id"] for b in s.builds()}


def test_a_build_keeps_the_rows_of_a_pending_wal_and_leaves_no_stale_wal(tmp_path):
    out = str(tmp_path / "fp.duckdb")
    small_database(out)
    _leave_pending_wal(out)
    bid = build(BuildConfig(out=out, ops=("geodesic",), cases=4, replays=1, workers=1)).build_id
    assert not os.path.exists(out + ".wal")
    assert _build_ids(out) == {"first", "in-wal", bid}
    with duckdb.connect(out) as c:  # and a plain read-write open (replays any WAL) accepts it too
        assert c.execute("SELECT count(*) FROM builds").fetchall() == [(3,)]


def test_migrate_keeps_the_rows_of_a_pending_wal_and_leaves_no_stale_wal(tmp_path):
    path = str(tmp_path / "v2.duckdb")
    small_database(path, version=2)
    _leave_pending_wal(path)
    assert migrate_database(path) == (2, 3)
    assert not os.path.exists(path + ".wal")
    assert _build_ids(path) == {"first", "in-wal"}


_HOLD_READ_ONLY = ("import duckdb, sys\n"
                   "c = duckdb.connect(':memory:')\n"
                   "c.execute(f\"ATTACH '{sys.argv[1]}' AS fp (READ_ONLY)\")\n"
                   "print(c.execute('SELECT count(*) FROM fp.builds').fetchall()[0][0], flush=True)\n"
                   "sys.stdin.read()\n")


def test_a_wal_that_cannot_be_folded_in_is_refused_before_any_work(tmp_path):
    """A program (a sidecar, say) holds the file open read-only: the build can read it, but gets no read-write open
    to fold the WAL in. One error line before the shards run; the file, its WAL and their rows are left as they were."""
    old, cur = str(tmp_path / "v2.duckdb"), str(tmp_path / "fp.duckdb")
    runs = {old: lambda: migrate_database(old), cur: lambda: build(BuildConfig(out=cur, ops=("geodesic",), cases=2))}
    for path, run in runs.items():
        small_database(path, version=2 if path == old else None)
        _leave_pending_wal(path)
        reader = subprocess.Popen([sys.executable, "-c", _HOLD_READ_ONLY, path], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert reader.stdout.readline().strip() == "2"  # it sees the WAL's row
            before = (open(path, "rb").read(), open(path + ".wal", "rb").read())
            t0 = time.monotonic()
            with pytest.raises(DatabaseError, match="cannot open it read-write to fold in its write-ahead log") as e:
                run()
            assert "\n" not in str(e.value) and time.monotonic() - t0 < 10, path
            assert (open(path, "rb").read(), open(path + ".wal", "rb").read()) == before
            assert not os.path.exists(path + ".work") and not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
        finally:
            reader.stdin.close()
            reader.wait(timeout=30)
    assert migrate_database(old) == (2, 3)  # the reader is gone: now the fold works
    assert _build_ids(old) == {"first", "in-wal"}


def _damage_wal(path: str) -> None:
    """Flip 64 bytes in the middle of a real pending WAL: DuckDB's checksum refuses it ("Corrupt WAL file")."""
    wal = open(path + ".wal", "rb").read()
    mid = len(wal) // 2
    open(path + ".wal", "wb").write(wal[:mid] + bytes(b ^ 0xFF for b in wal[mid:mid + 64]) + wal[mid + 64:])


def test_a_damaged_wal_is_not_blamed_on_other_programs(tmp_path):
    """Only a lock conflict is answered with 'close the programs using it': for a damaged WAL that advice sent the
    user hunting for programs that were not there. One line naming the database and the driver's reason."""
    path = str(tmp_path / "fp.duckdb")
    small_database(path)
    _leave_pending_wal(path)
    _damage_wal(path)
    with pytest.raises(DatabaseError) as e:
        fold_wal(path)  # what build (under its lock) and migrate call before copying the database
    msg = str(e.value)
    assert "\n" not in msg and "close the programs" not in msg, msg
    assert msg.startswith(f"{path}: ") and "folding in its write-ahead log" in msg and "Corrupt WAL" in msg, msg
