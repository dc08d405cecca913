"""Numbered schema migrations of the fingerprint database and the runner that applies them.

    optwin migrate fingerprints.duckdb

Each `vNNNN_<what>.py` holds one `migrate(conn)` that brings the schema from version NNNN-1 to NNNN.
The version lives in `schema_meta('schema_version')`; a file with fingerprint tables but no
`schema_meta` is v0 (the pre-versioned layout, see v0001_initial). The runner never imports the
driver: it takes a connection with `execute(sql, params).fetchall()`.
"""

from __future__ import annotations

from typing import Any, Callable

from optwin.errors import DatabaseError, SchemaVersionError
from optwin.fingerprints.migrations import v0001_initial, v0002_det_faults, v0003_case_intervals

MIGRATIONS: list[tuple[int, Callable[[Any], None]]] = [
    (1, v0001_initial.migrate),
    (2, v0002_det_faults.migrate),
    (3, v0003_case_intervals.migrate),
]
SCHEMA_VERSION: int = MIGRATIONS[-1][0]

_FINGERPRINT_TABLES = ("builds", "cases", "outcomes", "fingerprints", "representatives")


def _tables(conn: Any) -> set[str]:
    rows = conn.execute("SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database() "
                        "AND table_schema = current_schema()").fetchall()
    return {r[0] for r in rows}


def detect_version(conn: Any, path: str = "database") -> int | None:
    """The schema version of the open database: None when empty, 0 for the pre-versioned layout;
    DatabaseError when it holds tables but none of ours."""
    tables = _tables(conn)
    if "schema_meta" in tables:
        # fetchall, not fetchone: an unfinished result blocks the connection's next query (duckdb 2)
        rows = conn.execute("SELECT value FROM schema_meta WHERE key = 'schema_version'").fetchall()
        row = rows[0] if rows else None
        if row is None:
            return 0
        try:
            return int(row[0])
        except (TypeError, ValueError):
            raise SchemaVersionError(f"fingerprint database has an unreadable schema version {row[0]!r}: "
                                     "rebuild it with `optwin build`") from None
    if tables & set(_FINGERPRINT_TABLES):
        return 0
    if tables:  # another application's database: never "migrate" (that would add our tables among its own)
        names = ", ".join(sorted(tables)[:3]) + (", ..." if len(tables) > 3 else "")
        raise DatabaseError(f"{path}: a DuckDB database of something else (tables {names}), not a fingerprint database")
    return None


def version_message(path: str, found: int) -> str:
    if found > SCHEMA_VERSION:
        return (f"{path}: fingerprint database has schema version {found}, this optwin reads {SCHEMA_VERSION}: "
                "upgrade optwin (`optwin migrate` cannot downgrade)")
    return (f"{path}: fingerprint database has schema version {found}, this optwin reads {SCHEMA_VERSION}: "
            f"run `optwin migrate {path}`")


def check_version(conn: Any, path: str) -> int:
    """The version, or SchemaVersionError unless it is exactly SCHEMA_VERSION."""
    found = detect_version(conn, path)
    if found is None:
        found = 0
    if found != SCHEMA_VERSION:
        raise SchemaVersionError(version_message(path, found))
    return found


def upgrade(conn: Any, path: str = "database") -> tuple[int, int]:
    """Apply every migration above the current version, record it; returns (from, to).

    The caller runs this inside a transaction (or on a copy it swaps in), so a failure leaves the
    database at its old version.
    """
    start = detect_version(conn, path)
    current = 0 if start is None else start
    if current > SCHEMA_VERSION:
        raise SchemaVersionError(version_message(path, current))
    for version, step in MIGRATIONS:
        if version > current:
            step(conn)
            current = version
    conn.execute("CREATE TABLE IF NOT EXISTS schema_meta(key VARCHAR PRIMARY KEY, value VARCHAR)")
    conn.execute("DELETE FROM schema_meta WHERE key = 'schema_version'")
    conn.execute("INSERT INTO schema_meta VALUES ('schema_version', ?)", [str(current)])
    return (0 if start is None else start), current
