"""A symlinked database path: build and migrate write the file it points to, and lock that file.

    python -m pytest -q tests/test_build_symlink_out.py

The swap (os.replace onto the path) used to replace the link itself with a plain file, so the target kept its old
data (a migrate said "migrated 2 -> 3" and left the target at v2), and the lock was `<link>.lock`, so a build through
the target's own path was not refused.
"""

from __future__ import annotations

import os

import pytest

from optwin.errors import OptwinError
from optwin.fingerprints.build import BuildConfig, build
from optwin.fingerprints.build_lock import build_lock
from optwin.fingerprints.migrations import SCHEMA_VERSION
from optwin.fingerprints.store import migrate_database, open_store
from _small_db import small_database


def _linked(tmp_path, version: int | None = None) -> tuple[str, str]:
    (tmp_path / "data").mkdir()
    real, link = str(tmp_path / "data" / "real.duckdb"), str(tmp_path / "link.duckdb")
    small_database(real, version)
    os.symlink(os.path.join("data", "real.duckdb"), link)  # relative, as `ln -s data/real.duckdb link.duckdb`
    return real, link


def _leftovers(tmp_path) -> list[str]:
    return [p for d in (tmp_path, tmp_path / "data") for p in os.listdir(d) if ".tmp-" in p or p.endswith(".lock")]


def test_a_build_through_a_symlink_writes_its_target_and_locks_it(tmp_path):
    real, link = _linked(tmp_path)
    cfg = dict(ops=("geodesic",), cases=4, replays=1, workers=1)
    with build_lock(real):  # a build through the target's own path, still running
        with pytest.raises(OptwinError, match="another build .* is writing it"):
            build(BuildConfig(out=link, **cfg))
    bid = build(BuildConfig(out=link, **cfg)).build_id
    assert os.path.islink(link) and os.path.realpath(link) == os.path.realpath(real)
    with open_store(real) as s:
        assert [b["build_id"] for b in s.builds()] == ["first", bid]
    assert not _leftovers(tmp_path)


def test_migrate_through_a_symlink_migrates_its_target_and_locks_it(tmp_path):
    real, link = _linked(tmp_path, version=2)
    with build_lock(real):
        with pytest.raises(OptwinError, match="another build .* is writing it"):
            migrate_database(link)
    assert migrate_database(link) == (2, SCHEMA_VERSION)
    assert os.path.islink(link)
    with open_store(real) as s:  # the target itself is at the current version now
        assert s.schema_version() == SCHEMA_VERSION and [b["build_id"] for b in s.builds()] == ["first"]
    assert migrate_database(link) == (SCHEMA_VERSION, SCHEMA_VERSION)
    assert not _leftovers(tmp_path)
