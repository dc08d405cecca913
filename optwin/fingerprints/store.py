"""The fingerprint store interface: the one way builder, matcher, sidecar and dashboard reach the database.

    python -c "from optwin.fingerprints.store import open_store; s = open_store('fingerprints.duckdb'); print(s.builds())"

The schema is /work/notes/db_contract.md (v1). `open_store` returns the DuckDB implementation
(`duckdb_store.DuckDBStore`, the only module that imports duckdb); this module imports nothing
heavy, so the matcher can import it inside inference processes.

Contract shared by every implementation:
- Errors are optwin.errors.DatabaseError (missing, corrupt, locked file: one line naming the path and
  what to do) or SchemaVersionError (another schema version: "run `optwin migrate`").
- A read-only store is a snapshot: builds swap a new file in with os.replace, and a store opened
  before the swap keeps reading the old file; call `open_store` again to see the new build (cheap).
- Every read method takes `build_id=None`, meaning the current (latest) build, and returns a list of
  dicts (column -> value) in a stable order, or a pyarrow Table with `as_arrow=True`.
"""

from __future__ import annotations

import abc
import os
from typing import Any, Callable, Iterable, Sequence

Rows = list[dict[str, Any]]


class FingerprintStore(abc.ABC):
    """A fingerprint database at schema version `SCHEMA_VERSION` (see migrations)."""

    path: str
    read_only: bool

    # ---- read side (matcher, sidecar, dashboard) ----
    @abc.abstractmethod
    def schema_version(self) -> int:
        """The schema version recorded in the file (always the one this code reads once opened)."""

    @abc.abstractmethod
    def builds(self, as_arrow: bool = False) -> Rows | Any:
        """Every build with its provenance, oldest first (columns of the `builds` table)."""

    @abc.abstractmethod
    def latest_build_id(self) -> str | None:
        """The current build: the latest row of `builds` by created_at; None in an empty database."""

    @abc.abstractmethod
    def fingerprints(self, build_id: str | None = None, op: str | None = None, variant: str | None = None,
                     dtype: str | None = None, as_arrow: bool = False) -> Rows | Any:
        """Fingerprint rows (op, variant, dtype, region, fault_type, n_cases, n_replays, n_faults,
        probability, ci_low, ci_high, severity, feature_lo, feature_hi), ordered by those keys.
        Computed over non-held-out cases only; `feature_lo/hi` are JSON texts."""

    @abc.abstractmethod
    def current_fingerprints(self) -> Rows:
        """What the live matcher serves: every (op, variant, dtype)'s fingerprint rows from the newest build that
        replayed it (a build of some ops leaves the others' fingerprints current), with their build_id; ordered
        as `fingerprints`."""

    @abc.abstractmethod
    def cases(self, build_id: str | None = None, op: str | None = None, variant: str | None = None,
              dtype: str | None = None, region: str | None = None, case_ids: Sequence[int] | None = None,
              held_out: bool | None = None, limit: int | None = None, as_arrow: bool = False) -> Rows | Any:
        """Case rows (provenance: source, family, seed, case_index, shard; region; sketch and params
        as JSON texts; held_out), ordered by case_id."""

    @abc.abstractmethod
    def outcomes(self, build_id: str | None = None, case_ids: Sequence[int] | None = None,
                 op: str | None = None, variant: str | None = None, dtype: str | None = None,
                 limit: int | None = None, as_arrow: bool = False) -> Rows | Any:
        """Outcome rows (one per case: replays, noise, deterministic flags, replay fault counts,
        relative error quantiles), ordered by case_id."""

    @abc.abstractmethod
    def representatives(self, build_id: str | None = None, op: str | None = None, variant: str | None = None,
                        dtype: str | None = None, region: str | None = None, fault_type: str | None = None,
                        as_arrow: bool = False) -> Rows | Any:
        """Up to 3 failing cases per (op, variant, dtype, region, fault_type), with their rel_error."""

    @abc.abstractmethod
    def held_out_cases(self, build_id: str | None = None, op: str | None = None, variant: str | None = None,
                       dtype: str | None = None, as_arrow: bool = False) -> Rows | Any:
        """The held-out cases (~20%, kept out of fingerprints) joined with their outcomes: the
        calibration set of the matcher (case columns plus outcome columns)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the file. Idempotent."""

    # ---- write side (builder, migrate) ----
    @abc.abstractmethod
    def add_build(self, build: dict[str, Any], shard_files: Iterable[str]) -> dict[str, float]:
        """Gather a build's shard files into cases/outcomes, aggregate its fingerprints and
        representatives, and record its `builds` row, all in one transaction.

        `build` holds the `builds` columns except n_cases/n_replays (computed here). Shard files
        (Parquet, one row per case: case and outcome columns plus `f0..f3`, the region feature
        values) are deduplicated by shard and case_id. Returns counts (cases, replays, fingerprints,
        representatives) and timings in seconds (gather_s, aggregate_s, commit_s).
        """

    def __enter__(self) -> "FingerprintStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(path: str | os.PathLike, read_only: bool = True, create: bool = False) -> FingerprintStore:
    """Open the fingerprint database at `path`.

    read_only=True (matcher, dashboard): the file must exist at this code's schema version.
    read_only=False, create=True (builder): an empty/new file is created at the current version.
    """
    from optwin.fingerprints.duckdb_store import DuckDBStore  # lazy: only the store imports duckdb

    return DuckDBStore(os.fspath(path), read_only=read_only, create=create)


def migrate_database(path: str | os.PathLike, on_note: Callable[[str], None] | None = None) -> tuple[int, int]:
    """Upgrade the database at `path` in place (atomically: on a copy swapped in). Returns (from, to). on_note gets
    progress lines (copies left by killed builds removed); None says nothing."""
    from optwin.fingerprints.duckdb_store import migrate_file

    return migrate_file(os.fspath(path), on_note)
