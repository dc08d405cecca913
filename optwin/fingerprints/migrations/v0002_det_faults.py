"""Schema v2: `fingerprints.det_faults`, the cases of a cell whose deterministic emulation faults.

    optwin migrate fingerprints.duckdb

v1 kept only the noisy replays' counts (n_faults of n_replays). The GPU itself is deterministic, and
near a boundary the noisy replays fault more often than it does (stochastic rounding crosses the
boundary both ways; the device's fixed rounding does one thing), so the matcher blends the two
(MatcherConfig.det_weight). The column is filled for existing builds from their own `cases` and
`outcomes` rows (non-held-out cases, as the fingerprints count them), so a migrated database
answers exactly like a fresh build. Idempotent; never imports the driver.
"""

from __future__ import annotations

from typing import Any

VERSION = 2


def migrate(conn: Any) -> None:
    have = {r[0] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'fingerprints' "
        "AND table_schema = current_schema() AND table_catalog = current_database()").fetchall()}
    if "det_faults" not in have:
        conn.execute("ALTER TABLE fingerprints ADD COLUMN det_faults BIGINT")
    for fault in ("nonfinite", "precision_loss", "low_entropy"):
        conn.execute(f"""
UPDATE fingerprints f SET det_faults = x.k FROM (
  SELECT c.build_id, c.op, c.variant, c.dtype, c.region, sum(o.det_{fault}::INTEGER) AS k
  FROM cases c JOIN outcomes o ON c.build_id = o.build_id AND c.case_id = o.case_id
  WHERE NOT c.held_out AND o.det_{fault} IS NOT NULL
  GROUP BY ALL) x
WHERE f.det_faults IS NULL AND f.fault_type = '{fault}' AND f.build_id = x.build_id AND f.op = x.op
  AND f.variant = x.variant AND f.dtype = x.dtype AND f.region = x.region""")
