"""Fixtures shared by the test modules: the matcher fixture database and a Matcher on it.

A module that needs another database defines its own `db` (the dashboard tests' make_db, the matmul
sweep of test_monitor_autocast_fallback); pytest uses the module's fixture over this one.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A copy of the cached fixture database (tests/_matcher_fixture.py), one per test module, as each
    module made its own before: whatever a module's tests leave in their copy (a WAL, a changed row)
    reaches no other module, and never the cache that every later run copies."""
    # Imported here, not at the top: conftest loads before the test modules, several of which set
    # TRITON_INTERPRET=1 before their first import of torch and optwin; keep the load free of both.
    from _matcher_fixture import cached_db

    return cached_db(str(tmp_path_factory.mktemp("fp") / "fp.duckdb"))


@pytest.fixture(scope="module")
def m(db: str):
    """A Matcher on the module's `db`."""
    from optwin.fingerprints.matcher import Matcher

    return Matcher.open(db)
