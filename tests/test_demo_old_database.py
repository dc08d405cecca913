"""`optwin demo` rebuilds its own database when an other optwin's demo left it at another schema version.

    python -m pytest -q tests/test_demo_old_database.py

It used to stop with `error: optwin-demo/fingerprints.duckdb: fingerprint database has schema version 2, this
optwin reads 3: run optwin migrate ...`. The old file is moved aside, not deleted: `fingerprints.duckdb` is also
`optwin build`'s default --out, so with `--workdir .` it may be the user's own.
"""

from __future__ import annotations

import duckdb
import pytest

from optwin.cli import main
from optwin.errors import SchemaVersionError
from optwin.fingerprints.migrations import SCHEMA_VERSION
from optwin.fingerprints.store import open_store


@pytest.mark.parametrize("version", [SCHEMA_VERSION - 1, SCHEMA_VERSION + 1])  # an older and a newer optwin's
def test_demo_rebuilds_a_database_at_another_schema_version(tmp_path, capsys: pytest.CaptureFixture[str],
                                                            version: int) -> None:
    db = tmp_path / "fingerprints.duckdb"
    open_store(str(db), read_only=False, create=True).close()
    with duckdb.connect(str(db)) as c:  # as test_store_migrations makes one
        c.execute("UPDATE schema_meta SET value = ? WHERE key = 'schema_version'", [str(version)])
    with pytest.raises(SystemExit) as e:
        main(["demo", "--fast", "--steps", "10", "--workdir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert e.value.code == 0, err
    kept = tmp_path / "fingerprints.duckdb.old"
    lines = out.splitlines()
    note = f"{db} has schema version {version}, this optwin reads {SCHEMA_VERSION}: moved it to {kept}; building a new one"
    assert note in lines and lines[lines.index(note) + 1].startswith("quick build of the rmsnorm fingerprints"), out
    with open_store(str(db), read_only=True) as store:  # the new database, at this optwin's version
        assert store.schema_version() == SCHEMA_VERSION and store.latest_build_id() is not None
    with pytest.raises(SchemaVersionError, match=f"schema version {version}"):  # the old one, untouched
        open_store(str(kept), read_only=True)
