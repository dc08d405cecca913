"""Operator explorer: fault probability of one op/variant/dtype over its region features.

    streamlit run optwin/dashboard/app.py -- --db fingerprints.duckdb   (page "Operator explorer")

Probabilities are pooled over the features not on an axis: sum of faulting replays over sum of
replays, with the 95% Wilson interval of the pooled counts.
"""

from __future__ import annotations

import streamlit as st

from optwin.catalog import operator
from optwin.dashboard import charts
from optwin.dashboard.common import page_context, pick, pick_triple
from optwin.dashboard.data import boundary, pool

st.title("Operator explorer")
ctx = page_context()
assert ctx is not None

op, variant, dtype, c4 = pick_triple(ctx, "ex")
spec = operator(op)
fp_all = ctx.q("fingerprints", ctx.build, op, None, None, None)  # every variant/dtype/fault of the op
sel = fp_all[(fp_all.variant == variant) & (fp_all.dtype == dtype)]
with c4:
    # start on the fault type this triple shows most
    worst = sel.groupby("fault_type")["n_faults"].sum().idxmax() if len(sel) else None
    fault = pick("Fault type", list(spec.fault_types), "ex_fault", default=worst)
feats = list(spec.region_features)
one = sel[sel.fault_type == fault]

overall = pool(one.assign(all="all"), ["all"])
m1, m2, m3, m4 = st.columns(4)
m1.metric("Regions", int(one["region"].nunique()))
m2.metric("Replays", int(one["n_replays"].sum()))
m3.metric("Faulting replays", int(one["n_faults"].sum()))
m4.metric("P(fault), pooled", f"{overall['probability'].iloc[0]:.4f}" if len(overall) else "n/a")
if one.empty:
    st.info(f"no fingerprints for {op}/{variant}/{dtype} {fault} in build {ctx.build}")
    st.stop()

st.subheader("Fault probability over two features")
a1, a2 = st.columns(2)
with a1:
    fx = pick("X feature", feats, "ex_fx")
with a2:
    fy = pick("Y feature", [f for f in feats if f != fx] or feats, "ex_fy")
cells = pool(one, [f"bin:{fx}", fx, f"bin:{fy}", fy]) if fx != fy else pool(one, [f"bin:{fx}", fx])
if fx != fy:
    st.altair_chart(charts.heatmap(cells, fx, fy))
    st.caption(f"Pooled over {', '.join(f for f in feats if f not in (fx, fy)) or 'nothing'}; "
               "right: width of the 95% interval (wide = little evidence).")

st.subheader("Along one feature")
b1, b2 = st.columns([1, 2])
with b1:
    fc = pick("Feature", feats, "ex_curve")
    threshold = st.slider("Boundary threshold", 0.05, 0.95, 0.5, 0.05, key="ex_threshold")
points = pool(one, [f"bin:{fc}", fc])
edge = boundary(points, fc, threshold)
with b1:
    st.metric("Boundary", f"{fc} ≥ {edge:.4g}" if edge is not None else "not reached")
with b2:
    st.altair_chart(charts.curve(points, fc, threshold), width="stretch")

st.subheader("Fault types side by side")
by_type = pool(sel, ["fault_type", f"bin:{fc}", fc])
st.altair_chart(charts.fault_types_side_by_side(by_type, fc, threshold))

st.subheader(f"Variants of {op} compared ({dtype}, {fault})")
variants = fp_all[(fp_all.dtype == dtype) & (fp_all.fault_type == fault)]
by_variant = pool(variants, ["variant", f"bin:{fc}", fc])
st.altair_chart(charts.curve(by_variant, fc, threshold, color="variant"), width="stretch")
summary = pool(variants, ["variant"])
st.dataframe(summary, hide_index=True, key="ex_variants")
