"""`optwin serve` on bad input writes exactly one stderr line, `error: ...`, and exits 2.

    python -m pytest -x -q tests/test_serve_cli_one_line.py

It used to print its progress notice `optwin serve: loading DB` first and find the bad input while loading (or
binding, after the load): two lines, the first claiming a start that never came. Now the address, the bind and
the database file are checked before the notice.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from optwin.cli import main
from optwin.fingerprints.store import open_store
from test_dashboard_fixture import make_db

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("serve")
    good = str(make_db(d / "fp.duckdb", n_builds=1, n_cases=8))
    empty = str(d / "empty.duckdb")  # a fingerprint database before its first build
    open_store(empty, read_only=False, create=True).close()
    old = str(d / "v2.duckdb")
    open_store(old, read_only=False, create=True).close()
    with duckdb.connect(old) as c:  # as an older optwin left it (test_store_migrations does the same)
        c.execute("UPDATE schema_meta SET value = '2' WHERE key = 'schema_version'")
    garbage = d / "garbage.duckdb"
    garbage.write_bytes(bytes(range(256)) * 16)
    return {"good": good, "empty": empty, "old": old, "garbage": str(garbage), "missing": str(d / "none.duckdb")}


@pytest.mark.parametrize("db,args,msg", [
    ("missing", [], "error: no fingerprint database at"),
    ("garbage", [], "error: {db}: not a DuckDB file"),
    ("old", [], "error: {db}: fingerprint database has schema version 2, this optwin reads 3"),
    ("empty", [], "error: the fingerprint database {db} holds no build"),
    ("good", ["--listen", "tcp://10.255.255.1:18771"], "error: refusing to listen on non-loopback address"),
    ("good", ["--listen", "tcp://127.0.0.1:{busy}"], "error: cannot listen on tcp://127.0.0.1:{busy}: Address already in use"),
    ("good", ["--warnings-jsonl", "/nonexistent-optwin-dir/w.jsonl"],
     "error: --warnings-jsonl /nonexistent-optwin-dir/w.jsonl: No such file or directory"),
])
def test_bad_input_is_one_error_line(dbs: dict[str, str], db: str, args: list[str], msg: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as e:
            main(["serve", "--db", dbs[db], *[a.format(busy=port) for a in args]])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith(msg.format(db=dbs[db], busy=port)), err


def test_missing_db_through_the_console_entry_point(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-m", "optwin.cli", "serve", "--db", str(tmp_path / "none.duckdb")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"error: no fingerprint database at {tmp_path / 'none.duckdb'}: run `optwin build`"]
