"""Fault fingerprints: the DuckDB fault database (store), its builder, the matcher and the sidecar."""
