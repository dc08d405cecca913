"""Cases: representative failing cases of one op/variant/dtype, and a drill-down into one of them.

    streamlit run optwin/dashboard/app.py -- --db fingerprints.duckdb   (page "Cases")
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from optwin.catalog import DEFAULT_TOLERANCES, Tolerances, operator, resolve_tolerances
from optwin.dashboard import charts
from optwin.dashboard.common import page_context, pick, pick_triple
from optwin.dashboard.snippet import reproduce_snippet
from optwin.errors import CatalogError
from optwin.fingerprints.regions import with_derived

ALL = "all fault types"


def build_tolerances(flags: dict[str, Any], build: str) -> tuple[Tolerances, str | None]:
    """The tolerances the build judged its faults with (its recorded flags), and None; or the defaults and why, when
    it recorded none (databases from before builds recorded them) or ones that do not read."""
    recorded = flags.get("tolerances")
    if recorded is None:
        return DEFAULT_TOLERANCES, f"build {build} recorded no tolerances (an older database)"
    try:
        return resolve_tolerances(recorded), None
    except CatalogError as e:
        return DEFAULT_TOLERANCES, f"build {build}'s recorded tolerances do not read ({e})"


st.title("Cases")
ctx = page_context()
assert ctx is not None

op, variant, dtype, c4 = pick_triple(ctx, "cs")
spec = operator(op)
with c4:
    fault = pick("Fault type", [ALL, *spec.fault_types], "cs_fault")
if not (variant and dtype and fault):
    st.stop()

reps = ctx.q("representatives", ctx.build, op, variant, dtype, None if fault == ALL else fault)
# a case that is representative of several fault types has a row for each: count cases, not rows
st.metric("Representative failing cases", int(reps["case_id"].nunique()))
if reps.empty:
    st.info(f"no failing cases for {op}/{variant}/{dtype} ({fault}) in build {ctx.build}")
    st.stop()
st.caption("Up to 3 most-faulting cases per region and fault type, worst replay error (q50) first.")
st.dataframe(reps, hide_index=True, key="cs_table")

st.subheader("Drill-down")
ids = [int(i) for i in reps["case_id"].drop_duplicates()]
labels = {int(r.case_id): f"{r.case_id}: {r.fault_type}, region {r.region}, rel_error {r.rel_error:.3g}"
          for r in reps.drop_duplicates("case_id").itertuples()}
case_id = pick("Case", ids, "cs_case", format_func=lambda i: labels[i])
detail = ctx.q("case", ctx.build, case_id)
if detail is None:
    st.warning(f"case {case_id} is not in build {ctx.build}")
    st.stop()
row = detail.row

left, right = st.columns(2)
with left:
    st.markdown(f"**Provenance**: source `{row['source']}`, family `{row['family']}`, seed {row['seed']}, "
                f"case index {row['case_index']}, shard `{row['shard']}`, region `{row['region']}`"
                + (" (held out)" if row.get("held_out") else ""))
    st.markdown("**Sketch**")
    # with the op's derived region features (regions.DERIVED, never stored in a sketch), as the matcher places it
    try:
        full = dict(with_derived(op, detail.sketch))
    except (KeyError, TypeError, ValueError):  # a sketch lacking what a derived feature is computed from
        full = dict(detail.sketch)
    sketch = pd.DataFrame({"feature": list(full), "value": list(full.values())})
    sketch["region feature"] = sketch["feature"].isin(spec.region_features)
    sketch["derived"] = ~sketch["feature"].isin(list(detail.sketch))
    st.dataframe(sketch, hide_index=True, key="cs_sketch")
    flags = {ft: (row.get(f"det_{ft}"), row.get(f"n_{ft}")) for ft in spec.fault_types}
    st.markdown("**Faults** (deterministic flag; faulting replays of "
                f"{row.get('replays')} with noise `{row.get('noise')}`)")
    st.dataframe(pd.DataFrame([{"fault_type": k, "deterministic": v[0], "faulting_replays": v[1]} for k, v in flags.items()]),
                 hide_index=True, key="cs_faults")
# the case's own build: under "served" the picked build is not one build, and builds may differ in tolerances
case_build = str(row.get("build_id") or ctx.build)
build_flags = ctx.q("build_flags", case_build)
with right:
    st.markdown("**Replay error distribution** (relative error; red: precision_loss threshold)")
    tol, fallback = build_tolerances(build_flags, case_build)
    tau = tol.precision_tau(op, spec.out_dtype(dtype))
    st.altair_chart(charts.error_quantiles(row, tau), width="stretch")
    if fallback is None:
        st.caption(f"precision_loss threshold {tau:.3e}: build {case_build}'s tolerances")
    else:  # the line may not be where the build put it: say so rather than draw the defaults as if they were its
        st.warning(f"precision_loss threshold {tau:.3e}: the default tolerances, as {fallback}; the build may have "
                   "judged its faults with others")
    q = st.columns(3)
    for col, name in zip(q, ("err_q50", "err_q90", "err_max")):
        col.metric(name, f"{row.get(name):.3g}" if row.get(name) is not None else "n/a")

st.markdown("**Reproduce** (copy and run):")
st.code(reproduce_snippet(row, build_flags), language="python")
