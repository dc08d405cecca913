"""Compare builds: what changed between two builds of the database.

    streamlit run optwin/dashboard/app.py -- --db fingerprints.duckdb   (page "Compare builds")

Fingerprints are matched on (op, variant, dtype, region, fault type): present in both (changed or
same probability), only in B (new) or only in A (removed; "not rebuilt" when B did not replay that
op/variant/dtype at all: a build of some ops leaves the others as they were, served from an older build). p_matcher_* is the probability the matcher serves for
the cell (replays blended with the deterministic emulation, data.served_probability), p_replays_* the noisy
replays' fault rate alone; delta = p_matcher_B - p_matcher_A.
"""

from __future__ import annotations

import streamlit as st

from optwin.dashboard import charts
from optwin.dashboard.common import page_context, pick

ALL = "all operators"
STATUSES = ["changed", "new", "removed", "not rebuilt", "same"]

st.title("Compare builds")
ctx = page_context()
assert ctx is not None

ids = [str(b) for b in ctx.builds["build_id"]]  # newest first
if len(ids) < 2:
    st.info(f"{ctx.path} holds one build ({ids[0]}): nothing to compare yet")
    st.stop()
c1, c2, c3 = st.columns(3)
with c1:
    if st.session_state.get("cmp_a") not in ids:
        st.session_state["cmp_a"] = ids[1]
    a = st.selectbox("Build A (before)", ids, key="cmp_a")
with c2:
    b = pick("Build B (after)", ids, "cmp_b")
# ops the matcher refuses (binned on an older catalog's features) have no served probability: say why, once each
# (the same pass as the probabilities: one matcher index per op of each build)
diff_all, refused = ctx.q("comparison", a, b, None)
for line in refused:
    st.error(line)
with c3:
    op = pick("Operator", [ALL, *sorted(diff_all["op"].unique())], "cmp_op")
diff = diff_all if op == ALL else diff_all[diff_all["op"] == op]

counts = diff["status"].value_counts()
m = st.columns(6)
for col, s in zip(m, STATUSES):
    col.metric(f"Fingerprints {s}", int(counts.get(s, 0)))
regions = ctx.q("region_changes", a, b)
if op != ALL:
    regions = regions[regions["op"] == op]
m[5].metric("Regions new / removed", f"{int((regions.status == 'new').sum())} / {int((regions.status == 'removed').sum())}")

shown = st.multiselect("Show", STATUSES, default=["changed", "new", "removed"], key="cmp_status")
min_delta = st.slider("Minimum |delta| (the matcher's probability) for changed fingerprints", 0.0, 1.0, 0.0, 0.01, key="cmp_min_delta")
view = diff[diff["status"].isin(shown)]
view = view[(view["status"] != "changed") | (view["delta"].abs() >= min_delta)]
st.dataframe(view, hide_index=True, key="cmp_table")

left, right = st.columns(2)
with left:
    st.markdown("**P(fault), matcher, in A vs B** (fingerprints in both builds)")
    st.altair_chart(charts.compare_scatter(diff), width="stretch")
with right:
    st.markdown("**Regions in one build only**")
    st.dataframe(regions, hide_index=True, key="cmp_regions")
