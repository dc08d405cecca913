"""Copies of the database left by a build killed with SIGKILL during the gather are removed by the next build/migrate.

    python -m pytest -q tests/test_build_stale_copies.py

A build gathers into `<out>.tmp-<uuid>` and swaps it in; kill -9 runs no cleanup, so the copy (and its WAL) stayed,
and no later build removed it: every such kill leaked a full-size database copy.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
import sys

from optwin.fingerprints.build import BuildConfig, build
from optwin.fingerprints.store import migrate_database, open_store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The gather writes into the copy (so it has a WAL too), then the builder dies as under kill -9: no cleanup runs.
_KILLED_IN_GATHER = """
import os, signal, sys
from optwin.fingerprints import duckdb_store
def killed(self, build, files):
    self.conn.execute("INSERT INTO builds (build_id, created_at) VALUES ('half', TIMESTAMP '2020-01-01')")
    os.kill(os.getpid(), signal.SIGKILL)
duckdb_store.DuckDBStore.add_build = killed
from optwin.fingerprints.cli import _standalone
sys.argv = ["optwin", "build", *sys.argv[1:]]
_standalone()
"""

ARGS = dict(ops=("geodesic",), cases=4, replays=1, workers=1)


def _killed_build(out: str, *more: str) -> None:
    args = ["--ops", "geodesic", "--cases", "4", "--replays", "1", "--workers", "1", "--out", out, *more]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _KILLED_IN_GATHER, *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == -9, r.stderr


def _copies(d) -> list[str]:
    return sorted(p for p in os.listdir(d) if ".tmp-" in p)


def _database(path: str) -> None:
    with open_store(path, read_only=False, create=True) as s:
        s.add_build({"build_id": "first", "created_at": datetime.datetime(2019, 1, 1), "seed": 0, "flags": "{}",
                     "replays": 0, "noise": "none", "engine": "local", "duration_s": 0.0}, [])


def test_the_next_build_removes_copies_left_by_killed_builds_and_says_so(tmp_path):
    out = str(tmp_path / "fp.duckdb")
    _database(out)
    _killed_build(out)
    first = _copies(tmp_path)
    assert len(first) == 2 and first[1] == first[0] + ".wal", first  # a full copy and its WAL
    _killed_build(out, "--resume")  # the shards are kept: this one goes straight to the gather
    left = _copies(tmp_path)
    assert len(left) == 2 and left != first, left  # the first kill's copy went: kills no longer pile up copies
    # not ours to remove: another database's copy, and a file that only looks alike
    keep = ["other.duckdb.tmp-0123abcd", "fp.duckdb.tmp-notes.txt"]
    for name in keep:
        shutil.copyfile(out, tmp_path / name)
    notes: list[str] = []
    result = build(BuildConfig(out=out, resume=True, **ARGS), on_note=notes.append)
    assert _copies(tmp_path) == sorted(keep)
    said = [n for n in notes if "leftover" in n]
    assert len(said) == 1 and re.fullmatch(rf"removed 1 leftover copy of {re.escape(out)} \(\d+\.\d MB\) left by "
                                           "killed builds or migrates", said[0]), notes
    with open_store(out) as s:
        assert [b["build_id"] for b in s.builds()][-1] == result.build_id
        assert "half" not in {b["build_id"] for b in s.builds()}


def test_migrate_removes_copies_left_by_killed_builds_and_says_so(tmp_path):
    out = str(tmp_path / "fp.duckdb")
    _database(out)
    _killed_build(out)
    assert _copies(tmp_path)
    notes: list[str] = []
    assert migrate_database(out, on_note=notes.append) == (3, 3)
    assert _copies(tmp_path) == [] and len(notes) == 1 and notes[0].startswith(f"removed 1 leftover copy of {out} (")
    assert migrate_database(out, on_note=notes.append) == (3, 3) and len(notes) == 1  # nothing left: nothing said


def test_migrate_says_nothing_by_default_and_its_command_says_it_on_stderr(tmp_path, capfd):
    """The library prints nothing unasked (a service calling migrate_database got lines on its stderr); the
    `optwin migrate` command shows the note on stderr, its result on stdout."""
    out = str(tmp_path / "fp.duckdb")
    _database(out)
    shutil.copyfile(out, out + ".tmp-0123abcd")  # what a killed build leaves: a copy under a private name
    assert migrate_database(out) == (3, 3)
    assert _copies(tmp_path) == [] and capfd.readouterr().err == ""
    shutil.copyfile(out, out + ".tmp-4567cdef")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "optwin.fingerprints.cli", "migrate", out], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and _copies(tmp_path) == [], r.stderr
    assert r.stderr.startswith(f"removed 1 leftover copy of {out} (") and r.stdout.strip().endswith("version 3"), r
