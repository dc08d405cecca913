"""Schema v3: `fingerprints.ci_low` / `ci_high` over the cases of a cell, not its replays.

    optwin migrate fingerprints.duckdb

v1-v2 gave the Wilson interval n = n_replays independent trials. The replays of one case share its
input and nearly always agree, so that interval was too narrow by up to sqrt(replays) (a one-case
cell with 8 clean replays read ci_high 0.32; optwin.fingerprints.stats). v3 keeps the probability and
takes the cell's n_cases as the sample size, recomputed here from each row's own counts, so a
migrated database holds exactly what a fresh build writes. Idempotent; never imports the driver.
"""

from __future__ import annotations

from typing import Any

from optwin.fingerprints.stats import wilson_sql

VERSION = 3


def migrate(conn: Any) -> None:
    lo, hi = wilson_sql("n_faults", "n_replays", n_eff="n_cases")
    conn.execute(f"UPDATE fingerprints SET ci_low = {lo}, ci_high = {hi} WHERE n_replays > 0")
