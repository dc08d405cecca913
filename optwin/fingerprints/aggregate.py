"""SQL that turns a build's per-case rows into fingerprints and representatives (schema v1).

    python -c "from optwin.fingerprints.aggregate import fingerprints_sql; print(fingerprints_sql('staging'))"

Text only (no driver import): duckdb_store runs it over a staging table of shard rows, which carry
the case and outcome columns plus `f0..f3`, the values of the op's region features in catalog order.
One fault "trial" is a replay; a case with 0 replays counts its deterministic flag once (contract). The
interval's sample size is the cell's cases (schema v3; stats.py says why).
`det_faults` (schema v2) counts the cases whose deterministic emulation faults.
Only non-held-out cases count; regions holding held-out cases only get no fingerprint.
"""

from __future__ import annotations

from optwin.catalog import CATALOG
from optwin.fingerprints.stats import wilson_sql

N_FEATURE_COLUMNS = 4  # max len(region_features) over the catalog (softmax: 4)
FEATURE_COLUMNS = tuple(f"f{i}" for i in range(N_FEATURE_COLUMNS))
REPRESENTATIVES_PER_CELL = 3


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def trials_sql(staging: str) -> str:
    """One row per (non-held-out case, fault type of its op): k faults out of n trials."""
    parts = []
    for fault in ("nonfinite", "precision_loss", "low_entropy"):
        ops = [o.name for o in CATALOG.values() if fault in o.fault_types]
        if not ops:
            continue
        parts.append(
            f"SELECT op, variant, dtype, region, {_quote(fault)} AS fault_type, case_id, "
            f"CASE WHEN replays > 0 THEN n_{fault} ELSE det_{fault}::INTEGER END AS k, "
            f"CASE WHEN replays > 0 THEN replays ELSE 1 END AS n, det_{fault}::INTEGER AS det, err_q50, "
            f"{', '.join(FEATURE_COLUMNS)} "
            f"FROM {staging} WHERE NOT held_out AND op IN ({', '.join(map(_quote, ops))})")
    return "\nUNION ALL\n".join(parts)


def _features_json(agg: str) -> str:
    """CASE op WHEN ... THEN json_object(feature, agg(f_i), ...) END over the catalog's region features."""
    whens = []
    for o in CATALOG.values():
        pairs = ", ".join(f"{_quote(f)}, {agg}(f{i})" for i, f in enumerate(o.region_features))
        whens.append(f"WHEN {_quote(o.name)} THEN json_object({pairs})::VARCHAR")
    return f"CASE op {' '.join(whens)} ELSE '{{}}' END"


def fingerprints_sql(staging: str, build_id_param: str = "?") -> str:
    """SELECT producing the `fingerprints` columns (build_id from a bound parameter)."""
    lo, hi = wilson_sql("sum(k)", "sum(n)", n_eff="count(*)")  # the cases are the sample (stats.py)
    return f"""
WITH t AS ({trials_sql(staging)})
SELECT {build_id_param}::VARCHAR AS build_id, op, variant, dtype, region, fault_type,
       count(*)::INTEGER AS n_cases, sum(n)::BIGINT AS n_replays, sum(k)::BIGINT AS n_faults,
       sum(k)::DOUBLE / sum(n) AS probability, {lo} AS ci_low, {hi} AS ci_high,
       median(err_q50) FILTER (WHERE k > 0 AND NOT isnan(err_q50)) AS severity,
       {_features_json('min')} AS feature_lo, {_features_json('max')} AS feature_hi,
       sum(det)::BIGINT AS det_faults
FROM t GROUP BY op, variant, dtype, region, fault_type
"""


def representatives_sql(staging: str, build_id_param: str = "?") -> str:
    """SELECT producing `representatives`: the most-faulting cases of each cell (ties: lowest case_id)."""
    return f"""
WITH t AS ({trials_sql(staging)}),
ranked AS (SELECT *, row_number() OVER (PARTITION BY op, variant, dtype, region, fault_type
                                        ORDER BY k DESC, case_id) AS rn FROM t WHERE k > 0)
SELECT {build_id_param}::VARCHAR AS build_id, op, variant, dtype, region, fault_type, case_id,
       err_q50 AS rel_error
FROM ranked WHERE rn <= {REPRESENTATIVES_PER_CELL}
"""
