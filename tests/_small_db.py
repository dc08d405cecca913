"""A fingerprint database of one empty build, at this optwin's schema version or another: what the tests of
migrate, WAL folding and symlinked databases start from."""

from __future__ import annotations

import datetime

import duckdb

from optwin.fingerprints.store import open_store


def small_database(path: str, version: int | None = None) -> None:
    with open_store(path, read_only=False, create=True) as s:
        s.add_build({"build_id": "first", "created_at": datetime.datetime(2019, 1, 1), "seed": 0, "flags": "{}",
                     "replays": 0, "noise": "none", "engine": "local", "duration_s": 0.0}, [])
    if version is not None:
        with duckdb.connect(path) as c:
            c.execute("UPDATE schema_meta SET value = ? WHERE key = 'schema_version'", [str(version)])
