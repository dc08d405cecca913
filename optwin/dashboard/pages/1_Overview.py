"""Overview: the builds and their provenance, operators covered, cases and replays, fault totals.

    streamlit run optwin/dashboard/app.py -- --db fingerprints.duckdb
"""

from __future__ import annotations

import json

import altair as alt
import streamlit as st

from optwin.dashboard.common import page_context
from optwin.dashboard.data import SERVED

st.title("Overview")
ctx = page_context()
assert ctx is not None  # page_context stops the page otherwise

totals = ctx.q("totals", ctx.build)
cols = st.columns(5)
cols[0].metric("Builds", len(ctx.builds))
cols[1].metric("Operators", totals["ops"])
cols[2].metric("Cases", totals["cases"])
cols[3].metric("Replays", totals["replays"])
cols[4].metric("Regions", totals["regions"])

st.subheader("Builds")
st.caption("Provenance of every build in this file, newest first; the newest is the current build.")
st.dataframe(ctx.builds.drop(columns=["flags"]), hide_index=True, key="ov_builds")
for b in (ctx.q("served_builds") if ctx.build == SERVED else [ctx.build]):
    row = ctx.builds[ctx.builds["build_id"] == b].iloc[0]
    with st.expander(f"Flags of build {b}"):
        try:
            st.json(json.loads(row["flags"] or "{}"))
        except (TypeError, json.JSONDecodeError):
            st.code(str(row["flags"]))

served = ctx.q("served")
if served["build_id"].nunique() > 1:  # a build of some ops left others' older fingerprints current
    st.subheader("What the matcher serves")
    st.caption("Each (op, variant, dtype) from the newest build that replayed it: the live matcher and the sidecar "
               "answer from these fingerprints, whichever build is picked here.")
    st.dataframe(served, hide_index=True, key="ov_served")

st.subheader("Operators covered")
ops = ctx.q("ops_covered", ctx.build)
st.dataframe(ops, hide_index=True, key="ov_ops")

st.subheader("Fault totals")
st.caption(
    "det_cases: cases whose deterministic emulation faults; faulting_replays: noisy replays that fault; "
    "applicable_cases: cases where the fault type applies."
)
faults = ctx.q("fault_totals", ctx.build)
left, right = st.columns([1, 2])
left.dataframe(faults, hide_index=True, key="ov_faults")
right.altair_chart(
    alt.Chart(faults).mark_bar().encode(
        x=alt.X("fault_type:N", title=None), y=alt.Y("faulting_replays:Q", title="faulting replays"),
        tooltip=["fault_type", "det_cases", "faulting_replays"],
    ).properties(height=220),
    width="stretch",
)
