"""Schema v1 of the fingerprint database (/work/notes/db_contract.md): creates it, or upgrades v0.

    optwin migrate fingerprints.duckdb

v0 is the pre-versioned layout of the first prototypes (no `schema_meta` table): `builds`, `cases`,
`outcomes` and `fingerprints` without provenance columns, case families, held-out flags, intervals,
severities or feature ranges, and no `representatives`. `V0_LAYOUT` below is that layout, kept so
tests can create a v0 file. `migrate` is idempotent: it creates missing tables, adds missing
columns with safe defaults, and fills the Wilson intervals of v0 fingerprints from their counts.
Takes any DB-API-like connection with `execute(sql, params)`; it never imports the driver.
"""

from __future__ import annotations

from typing import Any

from optwin.fingerprints.stats import wilson_sql

VERSION = 1

# table -> [(column, type, default for rows that predate the column)]
TABLES: dict[str, list[tuple[str, str, str | None]]] = {
    "builds": [
        ("build_id", "VARCHAR", None), ("created_at", "TIMESTAMP", None), ("code_version", "VARCHAR", "'unknown'"),
        ("twin_version", "VARCHAR", "'unknown'"), ("seed", "BIGINT", None), ("flags", "VARCHAR", "'{}'"),
        ("profile", "VARCHAR", None), ("replays", "INTEGER", None), ("noise", "VARCHAR", None),
        ("engine", "VARCHAR", "'unknown'"), ("n_cases", "BIGINT", None), ("n_replays", "BIGINT", None),
        ("duration_s", "DOUBLE", None),
    ],
    "cases": [
        ("build_id", "VARCHAR", None), ("case_id", "BIGINT", None), ("op", "VARCHAR", None),
        ("variant", "VARCHAR", None), ("dtype", "VARCHAR", None), ("source", "VARCHAR", None),
        ("family", "VARCHAR", "'unknown'"), ("seed", "BIGINT", None), ("case_index", "INTEGER", None),
        ("shard", "VARCHAR", "'v0'"), ("region", "VARCHAR", None), ("sketch", "VARCHAR", None),
        ("params", "VARCHAR", None), ("held_out", "BOOLEAN", "false"),
    ],
    "outcomes": [
        ("build_id", "VARCHAR", None), ("case_id", "BIGINT", None), ("replays", "INTEGER", None),
        ("noise", "VARCHAR", None), ("det_nonfinite", "BOOLEAN", None), ("det_precision_loss", "BOOLEAN", None),
        ("det_low_entropy", "BOOLEAN", None), ("n_nonfinite", "INTEGER", None),
        ("n_precision_loss", "INTEGER", None), ("n_low_entropy", "INTEGER", None),
        ("det_rel_error", "DOUBLE", None), ("err_q50", "DOUBLE", None), ("err_q90", "DOUBLE", None),
        ("err_max", "DOUBLE", None),
    ],
    "fingerprints": [
        ("build_id", "VARCHAR", None), ("op", "VARCHAR", None), ("variant", "VARCHAR", None),
        ("dtype", "VARCHAR", None), ("region", "VARCHAR", None), ("fault_type", "VARCHAR", None),
        ("n_cases", "INTEGER", None), ("n_replays", "BIGINT", None), ("n_faults", "BIGINT", None),
        ("probability", "DOUBLE", None), ("ci_low", "DOUBLE", None), ("ci_high", "DOUBLE", None),
        ("severity", "DOUBLE", None), ("feature_lo", "VARCHAR", "'{}'"), ("feature_hi", "VARCHAR", "'{}'"),
    ],
    "representatives": [
        ("build_id", "VARCHAR", None), ("op", "VARCHAR", None), ("variant", "VARCHAR", None),
        ("dtype", "VARCHAR", None), ("region", "VARCHAR", None), ("fault_type", "VARCHAR", None),
        ("case_id", "BIGINT", None), ("rel_error", "DOUBLE", None),
    ],
}

V0_LAYOUT: tuple[str, ...] = (
    "CREATE TABLE builds(build_id VARCHAR, created_at TIMESTAMP, seed BIGINT, flags VARCHAR, replays INTEGER, "
    "noise VARCHAR, n_cases BIGINT)",
    "CREATE TABLE cases(build_id VARCHAR, case_id BIGINT, op VARCHAR, variant VARCHAR, dtype VARCHAR, source VARCHAR, "
    "seed BIGINT, case_index INTEGER, region VARCHAR, sketch VARCHAR, params VARCHAR)",
    "CREATE TABLE outcomes(" + ", ".join(f"{c} {t}" for c, t, _ in TABLES["outcomes"]) + ")",
    "CREATE TABLE fingerprints(build_id VARCHAR, op VARCHAR, variant VARCHAR, dtype VARCHAR, region VARCHAR, "
    "fault_type VARCHAR, n_cases INTEGER, n_replays BIGINT, n_faults BIGINT, probability DOUBLE)",
)


def _columns(conn: Any, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = ? AND table_schema = current_schema() "
        "AND table_catalog = current_database()", [table]).fetchall()
    return [r[0] for r in rows]


def migrate(conn: Any) -> None:
    """Bring an empty or v0 database to v1 (the caller records the version and commits)."""
    for table, cols in TABLES.items():
        have = _columns(conn, table)
        if not have:
            conn.execute(f"CREATE TABLE {table}(" + ", ".join(f"{c} {t}" for c, t, _ in cols) + ")")
            continue
        for col, typ, default in cols:
            if col not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {col} {typ}")
                if default is not None:
                    conn.execute(f"UPDATE {table} SET {col} = {default}")
    # v0 fingerprints had no intervals: recompute them from their own counts.
    lo, hi = wilson_sql("n_faults", "n_replays")
    conn.execute(f"UPDATE fingerprints SET ci_low = {lo}, ci_high = {hi} WHERE ci_low IS NULL AND n_replays > 0")
    conn.execute("UPDATE builds SET n_replays = (SELECT sum(o.replays) FROM outcomes o WHERE o.build_id = builds.build_id) "
                 "WHERE n_replays IS NULL")
