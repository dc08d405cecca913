"""Fault fingerprints: the DuckDB fault database (store), its builder, the matcher and the sidecar.

    python -c "from optwin.fingerprints import Matcher; print(Matcher.open('fingerprints.duckdb'))"

Only the matcher loads here: it runs inside inference processes, so the builder, DuckDB and the
sidecar stay out of this import path (the store is opened lazily by `Matcher.open`).
"""

from optwin.fingerprints.matcher import Matcher

__all__ = ["Matcher"]
