"""DuckDB implementation of the fingerprint store (the only module that imports duckdb).

    python -c "from optwin.fingerprints.duckdb_store import DuckDBStore; print(DuckDBStore('fingerprints.duckdb').builds())"

Read-only stores ATTACH the file into a private in-memory DuckDB instance instead of connecting to
the path: duckdb caches one instance per path inside a process, so a plain `connect(path)` after a
rebuild swapped the file (os.replace) could hand back the cached instance of the OLD file. Each
ATTACH opens the current file; a store opened earlier keeps its old inode and keeps working.
Writers (the builder, migrate) only ever write to a private copy that is swapped in afterwards.
Driver errors become DatabaseError / SchemaVersionError with one line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import time
import uuid
from typing import Any, Callable, Iterable, Sequence

import duckdb

from optwin.errors import DatabaseError, SchemaVersionError, first_line
from optwin.fingerprints import aggregate, migrations
from optwin.fingerprints.migrations.v0001_initial import TABLES
from optwin.fingerprints.store import FingerprintStore, Rows

_DISK_FULL = ("no space left", "file too large", "disk quota")


def is_disk_full(e: BaseException) -> bool:
    """True for ENOSPC-like failures, whether from the OS or from DuckDB's own I/O layer."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return True
    return any(s in str(e).lower() for s in _DISK_FULL)


def is_interrupt(e: BaseException) -> bool:
    """True for Ctrl-C/SIGTERM arriving while DuckDB runs a query: DuckDB swallows the signal handler's
    KeyboardInterrupt and fails the query instead, with InterruptException or a bare RuntimeError
    ("Query interrupted", not a duckdb.Error)."""
    if isinstance(e, (KeyboardInterrupt, duckdb.InterruptException)):
        return True
    return isinstance(e, RuntimeError) and str(e).strip().lower().startswith("query interrupted")


def _fail(e: BaseException, path: str, what: str) -> BaseException:
    """What to raise for a driver failure: KeyboardInterrupt for an interrupt, else driver_error's one line."""
    return KeyboardInterrupt() if is_interrupt(e) else driver_error(e, path, what)


def driver_error(e: BaseException, path: str, what: str) -> DatabaseError:
    first = first_line(e)
    if is_disk_full(e):
        return DatabaseError(f"{path}: disk full while {what}: free space and run again (`optwin build --resume` keeps finished shards)")
    if "lock" in first.lower():
        return DatabaseError(f"{path}: database is locked by another process while {what} ({first})")
    return DatabaseError(f"{path}: not a readable fingerprint database while {what} ({first})")


class DuckDBStore(FingerprintStore):
    def __init__(self, path: str, read_only: bool = True, create: bool = False):
        self.path, self.read_only = path, read_only
        self._conn: duckdb.DuckDBPyConnection | None = None
        exists = os.path.exists(path)
        if not exists and (read_only or not create):
            raise DatabaseError(f"no fingerprint database at {path}: run `optwin build`")
        if exists and os.path.isfile(path) and os.path.getsize(path) > 0 and not is_duckdb_file(path):
            # Checked before DuckDB sees it: ATTACH of a SQLite file would fetch a scanner extension off the network
            raise DatabaseError(f"{path}: not a DuckDB file, so not a fingerprint database")
        try:
            if read_only:
                self._conn = duckdb.connect(":memory:")
                self._conn.execute(f"ATTACH {_lit(path)} AS fp (TYPE duckdb, READ_ONLY)")
                self._conn.execute("USE fp")
            else:
                self._conn = duckdb.connect(path)
        except duckdb.Error as e:
            self.close()
            raise _fail(e, path, "opening it") from None
        try:
            if not read_only and migrations.detect_version(self._conn, path) is None:
                self._conn.execute("BEGIN")
                migrations.upgrade(self._conn, path)
                self._conn.execute("COMMIT")
            self._version = migrations.check_version(self._conn, path)
        except DatabaseError:  # another schema version, or another application's database
            self.close()
            raise
        except duckdb.Error as e:
            self.close()
            raise _fail(e, path, "reading its schema version") from None

    # ---- helpers ----
    @property
    def conn(self) -> duckdb.DuckDBPyConnection:
        if self._conn is None:
            raise DatabaseError(f"{self.path}: the fingerprint store is closed")
        return self._conn

    def _query(self, sql: str, params: Sequence[Any] = (), as_arrow: bool = False) -> Rows | Any:
        try:
            if as_arrow:
                rel = self.conn.sql(sql, params=list(params))
                return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
            cur = self.conn.execute(sql, list(params))
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, row)) for row in cur.fetchall()]
        except duckdb.Error as e:
            raise _fail(e, self.path, "reading it") from None

    def _resolve(self, build_id: str | None) -> str | None:
        return build_id if build_id is not None else self.latest_build_id()

    def _select(self, table: str, build_id: str | None, filters: dict[str, Any], order: str,
                limit: int | None = None, as_arrow: bool = False, alias: str = "") -> Rows | Any:
        bid = self._resolve(build_id)
        where, params = [f"{alias}build_id = ?"], [bid]
        for col, val in filters.items():
            if val is None:
                continue
            if isinstance(val, (list, tuple)):
                if not val:
                    where.append("false")
                    continue
                where.append(f"{col} IN ({', '.join('?' for _ in val)})")
                params.extend(int(v) for v in val)
            else:
                where.append(f"{col} = ?")
                params.append(val)
        sql = f"SELECT * FROM {table} WHERE {' AND '.join(where)} ORDER BY {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self._query(sql, params, as_arrow)

    # ---- read side ----
    def schema_version(self) -> int:
        return self._version

    def builds(self, as_arrow: bool = False) -> Rows | Any:
        return self._query("SELECT * FROM builds ORDER BY created_at, build_id", (), as_arrow)

    def latest_build_id(self) -> str | None:
        rows = self._query("SELECT build_id FROM builds ORDER BY created_at DESC, build_id DESC LIMIT 1")
        return rows[0]["build_id"] if rows else None

    def fingerprints(self, build_id=None, op=None, variant=None, dtype=None, as_arrow=False):
        return self._select("fingerprints", build_id, {"op": op, "variant": variant, "dtype": dtype},
                            "op, variant, dtype, region, fault_type", None, as_arrow)

    def current_fingerprints(self):
        newest = ("SELECT build_id, op, variant, dtype FROM (SELECT t.*, row_number() OVER (PARTITION BY op, variant, "
                  "dtype ORDER BY b.created_at DESC, b.build_id DESC) AS k FROM (SELECT DISTINCT build_id, op, variant, "
                  "dtype FROM fingerprints) t JOIN builds b USING (build_id)) WHERE k = 1")
        return self._query(f"SELECT f.* FROM fingerprints f JOIN ({newest}) USING (build_id, op, variant, dtype) "
                           "ORDER BY op, variant, dtype, region, fault_type")

    def cases(self, build_id=None, op=None, variant=None, dtype=None, region=None, case_ids=None,
              held_out=None, limit=None, as_arrow=False):
        return self._select("cases", build_id, {"op": op, "variant": variant, "dtype": dtype, "region": region,
                                                "case_id": case_ids, "held_out": held_out}, "case_id", limit, as_arrow)

    def outcomes(self, build_id=None, case_ids=None, op=None, variant=None, dtype=None, limit=None, as_arrow=False):
        if op is None and variant is None and dtype is None:
            return self._select("outcomes", build_id, {"case_id": case_ids}, "case_id", limit, as_arrow)
        table = "(SELECT o.*, c.op, c.variant, c.dtype FROM outcomes o JOIN cases c USING (build_id, case_id))"
        return self._select(table, build_id, {"case_id": case_ids, "op": op, "variant": variant, "dtype": dtype},
                            "case_id", limit, as_arrow)

    def representatives(self, build_id=None, op=None, variant=None, dtype=None, region=None, fault_type=None,
                        as_arrow=False):
        return self._select("representatives", build_id, {"op": op, "variant": variant, "dtype": dtype,
                                                          "region": region, "fault_type": fault_type},
                            "op, variant, dtype, region, fault_type, case_id", None, as_arrow)

    def held_out_cases(self, build_id=None, op=None, variant=None, dtype=None, as_arrow=False):
        out_cols = ", ".join(f"o.{c}" for c, _, _ in TABLES["outcomes"] if c not in ("build_id", "case_id"))
        table = f"(SELECT c.*, {out_cols} FROM cases c JOIN outcomes o USING (build_id, case_id) WHERE c.held_out)"
        return self._select(table, build_id, {"op": op, "variant": variant, "dtype": dtype}, "case_id", None, as_arrow)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    # ---- write side ----
    def add_build(self, build: dict[str, Any], shard_files: Iterable[str]) -> dict[str, float]:
        if self.read_only:
            raise DatabaseError(f"{self.path}: opened read-only; cannot add a build")
        files = sorted(set(shard_files))
        bid = build["build_id"]
        c = self.conn
        case_cols = [col for col, _, _ in TABLES["cases"] if col != "build_id"]
        out_cols = [col for col, _, _ in TABLES["outcomes"] if col != "build_id"]
        t0 = time.perf_counter()
        try:
            c.execute("BEGIN")
            if c.execute("SELECT count(*) FROM builds WHERE build_id = ?", [bid]).fetchall()[0][0]:
                raise DatabaseError(f"{self.path}: build {bid} is already in the database")
            # Dedup by shard, then by case_id: a shard file is read once even if listed twice, and a
            # case can only belong to one shard (case ids hash the shard's op/variant/dtype/source).
            if files:
                c.execute("CREATE OR REPLACE TEMP TABLE staging AS "
                          f"SELECT * FROM read_parquet({_list(files)}, union_by_name = true) "
                          "QUALIFY row_number() OVER (PARTITION BY case_id ORDER BY shard) = 1")
            else:
                c.execute("CREATE OR REPLACE TEMP TABLE staging AS SELECT * FROM ("
                          + _empty_staging_sql() + ") WHERE false")
            # BY NAME, never by position: a migrated database has its later columns at the end (v0 -> v1
            # appended cases.family/shard/held_out after params), so positions differ from a fresh file's.
            c.execute(f"INSERT INTO cases BY NAME SELECT ?::VARCHAR AS build_id, {', '.join(case_cols)} FROM staging", [bid])
            c.execute(f"INSERT INTO outcomes BY NAME SELECT ?::VARCHAR AS build_id, {', '.join(out_cols)} FROM staging",
                      [bid])
            t1 = time.perf_counter()
            c.execute("INSERT INTO fingerprints BY NAME " + aggregate.fingerprints_sql("staging"), [bid])
            c.execute("INSERT INTO representatives BY NAME " + aggregate.representatives_sql("staging"), [bid])
            n_cases, n_replays = c.execute("SELECT count(*), coalesce(sum(replays), 0) FROM staging").fetchall()[0]
            row = dict(build, n_cases=int(n_cases), n_replays=int(n_replays))
            cols = [col for col, _, _ in TABLES["builds"]]
            c.execute(f"INSERT INTO builds ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
                      [row.get(col) for col in cols])
            n_fp = c.execute("SELECT count(*) FROM fingerprints WHERE build_id = ?", [bid]).fetchall()[0][0]
            n_rep = c.execute("SELECT count(*) FROM representatives WHERE build_id = ?", [bid]).fetchall()[0][0]
            c.execute("DROP TABLE staging")
            t2 = time.perf_counter()
            c.execute("COMMIT")
        except DatabaseError:
            _rollback(c)
            raise
        except BaseException as e:  # an interrupt mid-query is a RuntimeError: it stops the build like Ctrl-C does
            _rollback(c)
            if is_interrupt(e):
                raise KeyboardInterrupt from None
            if isinstance(e, (duckdb.Error, OSError)):
                raise driver_error(e, self.path, "writing the build") from None
            raise
        return {"cases": int(n_cases), "replays": int(n_replays), "fingerprints": int(n_fp),
                "representatives": int(n_rep), "gather_s": t1 - t0, "aggregate_s": t2 - t1,
                "commit_s": time.perf_counter() - t2}

    def checkpoint(self) -> None:
        """Fold the WAL into the file so it can be copied/renamed as one file."""
        try:
            self.conn.execute("CHECKPOINT")
        except (duckdb.Error, RuntimeError) as e:
            if not isinstance(e, duckdb.Error) and not is_interrupt(e):
                raise
            raise _fail(e, self.path, "checkpointing") from None


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _list(files: Sequence[str]) -> str:
    return "[" + ", ".join(_lit(f) for f in files) + "]"


def _empty_staging_sql() -> str:
    from optwin.fingerprints.shards import SHARD_SCHEMA_SQL

    return "SELECT " + ", ".join(f"NULL::{t} AS {c}" for c, t in SHARD_SCHEMA_SQL)


def _rollback(c: duckdb.DuckDBPyConnection) -> None:
    try:
        c.execute("ROLLBACK")
    except duckdb.Error:
        pass


def temp_path(path: str) -> str:
    """A private name beside `path` for a copy to write and swap in: unique per call (uuid4, not the pid, which
    a later process can reuse while a killed one's copy is still lying there)."""
    return f"{path}.tmp-{uuid.uuid4().hex}"


def remove_stale_copies(path: str, on_note: Callable[[str], None] | None = None, shown_as: str | None = None) -> None:
    """Remove the private copies `<path>.tmp-<hex>` (with their `.wal` and DuckDB's `.tmp` spill directory) that a
    build or migrate killed before its swap (kill -9, power loss) left beside `path`, and say so through on_note
    (one line naming `shown_as`, the name the user gave; nothing when none was found or on_note is None).

    Call it holding the build lock: a build or migrate holds the lock for its copy's whole life, so no live one owns
    a copy found then. Left alone, every such kill leaked a full-size database copy that nothing removed."""
    folder, base = os.path.split(path)
    pattern = re.compile(re.escape(base) + r"\.tmp-[0-9a-f]+(\.wal|\.tmp)?")
    copies = size = 0
    for name in sorted(os.listdir(folder or ".")):
        if not pattern.fullmatch(name):
            continue
        p = os.path.join(folder, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
            continue
        with contextlib.suppress(FileNotFoundError):
            size += os.lstat(p).st_size
            os.remove(p)
            copies += not name.endswith((".wal", ".tmp"))
    if copies and on_note:
        what = "copy" if copies == 1 else "copies"
        on_note(f"removed {copies} leftover {what} of {shown_as or path} ({size / 1e6:.1f} MB) left by killed builds "
                "or migrates")


def remove_db_files(path: str) -> None:
    """Remove a database file and its WAL (either may be absent)."""
    for p in (path, path + ".wal"):
        if os.path.lexists(p):
            os.remove(p)


def fold_wal(path: str) -> None:
    """Fold a pending `<path>.wal` (left by a writer that died or never closed) into `path`. Call it holding the
    build lock.

    A copy of the main file alone lacks the WAL's committed rows, and a WAL left beside a file swapped in over
    `path` no longer matches it: DuckDB then refuses to open the file at all ("WAL checkpoint iteration does not
    match"). Checkpointing through a read-write connection is the one way to get them into the file DuckDB
    accepts; if that connection cannot be had (a program has the file open, or the WAL is damaged), the build or
    migrate is refused rather than losing the rows."""
    wal = path + ".wal"
    if not os.path.lexists(wal):
        return
    try:
        conn = duckdb.connect(path)
        try:
            conn.execute("CHECKPOINT")
        finally:
            conn.close()
    except (duckdb.Error, RuntimeError) as e:
        if is_interrupt(e):
            raise KeyboardInterrupt from None
        if not isinstance(e, duckdb.Error):
            raise
        first = first_line(e)
        if not _is_lock_conflict(first):  # a damaged WAL, a full disk, a newer format: closing programs won't help
            raise driver_error(e, path, "folding in its write-ahead log") from None
        raise DatabaseError(f"{path}: cannot open it read-write to fold in its write-ahead log {wal} ({first}); "
                            "close the programs using it and run again (nothing was changed)") from None


def _is_lock_conflict(first: str) -> bool:
    """True for DuckDB's 'Could not set lock on file ...: Conflicting lock is held' (another program has the file
    open); not a bare "lock" substring, which "block" in a corruption message would match."""
    low = first.lower()
    return "could not set lock" in low or "conflicting lock" in low


def copy_for_write(src: str, dst: str) -> None:
    """Copy an existing database (and nothing half-written: src is only ever replaced atomically), its pending
    WAL folded in first (fold_wal: the caller holds the build lock).

    A `dst` or `dst.wal` already there is removed first: DuckDB would replay a stale WAL onto the fresh copy.
    On failure nothing of `dst` is left behind."""
    fold_wal(src)
    try:
        remove_db_files(dst)
        shutil.copyfile(src, dst)
    except OSError as e:
        try:
            remove_db_files(dst)
        except OSError:
            pass
        raise driver_error(e, dst, "copying the database") from None


def swap_in(tmp: str, path: str) -> None:
    """os.replace the finished copy `tmp` (checkpointed: no WAL of its own) onto `path`, removing `path`'s WAL
    first. In this order a kill between the two steps leaves the old file (its WAL was folded in by copy_for_write)
    without a WAL: consistent. The other order could leave the new file beside the old file's WAL, which DuckDB
    refuses to open. A WAL found here was written after the fold by a program outside the build lock; its rows
    are not in the copy either way."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path + ".wal")
    os.replace(tmp, path)


def is_duckdb_file(path: str) -> bool:
    """True if the file starts with DuckDB's header (bytes 8-12 read "DUCK"); an empty or short
    file, or another format, is not one."""
    try:
        with open(path, "rb") as f:
            return f.read(12)[8:12] == b"DUCK"
    except OSError:
        return False


def migrate_file(path: str, on_note: Callable[[str], None] | None = None) -> tuple[int, int]:
    """Upgrade `path` to the current schema on a private copy, then swap it in with os.replace.

    Holds the database's build lock (a build finishing meanwhile would otherwise be undone by the swap), and
    leaves a file already at the current version alone: no copy, no swap. Copies left by killed builds or migrates
    are removed, and said so through on_note (default: nothing; `optwin migrate` passes one that writes stderr)."""
    from optwin.fingerprints.build_lock import build_lock

    if not os.path.exists(path):
        raise DatabaseError(f"no fingerprint database at {path}: run `optwin build`")
    # Resolved once, as a build does: through a symlink the swap replaced the link with a plain file, leaving its
    # target unmigrated, and the lock was another file than a build through the target's path takes.
    real = os.path.realpath(path)
    if not is_duckdb_file(real):  # checked here: the driver's own error would name the private copy
        raise DatabaseError(f"{path}: not a DuckDB file, so not a fingerprint database (left unchanged)")
    with build_lock(real, "migrate"):
        remove_stale_copies(real, on_note, shown_as=path)
        found = _file_version(real, path)
        if found == migrations.SCHEMA_VERSION:
            return found, found
        if found is not None and found > migrations.SCHEMA_VERSION:
            raise SchemaVersionError(migrations.version_message(path, found))
        return _migrate_copy(real, path)


def _file_version(real: str, path: str) -> int | None:
    """The schema version of the file at `real`, read through a read-only ATTACH (the file is not written);
    errors name `path`, the name the user gave."""
    try:
        conn = duckdb.connect(":memory:")
    except duckdb.Error as e:
        raise _fail(e, path, "opening it") from None
    try:
        conn.execute(f"ATTACH {_lit(real)} AS fp (TYPE duckdb, READ_ONLY)")
        conn.execute("USE fp")
        return migrations.detect_version(conn, path)
    except duckdb.Error as e:
        raise _fail(e, path, "reading its schema version") from None
    finally:
        conn.close()


def _migrate_copy(real: str, path: str) -> tuple[int, int]:
    """Migrate a copy of `real` (the resolved file) and swap it in; errors name `path`."""
    tmp = temp_path(real)
    try:
        copy_for_write(real, tmp)
        try:
            conn = duckdb.connect(tmp)
        except duckdb.Error as e:
            raise _fail(e, path, "opening it") from None
        try:
            conn.execute("BEGIN")
            found = migrations.detect_version(conn, path)
            result = migrations.upgrade(conn, path) if found != migrations.SCHEMA_VERSION else (found, found)
            conn.execute("COMMIT")
            conn.execute("CHECKPOINT")
        except (duckdb.Error, RuntimeError) as e:
            if not isinstance(e, duckdb.Error) and not is_interrupt(e):
                raise
            raise _fail(e, path, "migrating it") from None
        finally:
            conn.close()
        swap_in(tmp, real)
        return result
    finally:
        remove_db_files(tmp)
