"""Operator explorer: fault probability of one op/variant/dtype over its region features.

    streamlit run optwin/dashboard/app.py -- --db fingerprints.duckdb   (page "Operator explorer")

Each cell has two probabilities, labelled apart: "P(fault), matcher" is what the matcher and sidecar serve
(the replays blended with the deterministic emulation, computed by the matcher's own code: data.served_probability),
the one its 0.25 threshold applies to; "P(fault), replays" is the noisy replays' fault rate alone, with the 95%
Wilson interval of its counts. Both are pooled over the features not on an axis, with the replays as weights.
"""

from __future__ import annotations

import streamlit as st

from optwin.catalog import operator
from optwin.dashboard import charts
from optwin.dashboard.common import page_context, pick, pick_triple
from optwin.dashboard.data import boundary, pool
from optwin.errors import OptwinError
from optwin.fingerprints.matcher import MatcherConfig

st.title("Operator explorer")
ctx = page_context()
assert ctx is not None

op, variant, dtype, c4 = pick_triple(ctx, "ex")
spec = operator(op)
try:
    fp_all = ctx.q("fingerprints", ctx.build, op, None, None, None)  # every variant/dtype/fault of the op
except OptwinError as e:  # binned on an older catalog's features: the matcher refuses it, and so do we
    st.error(str(e))
    st.stop()
sel = fp_all[(fp_all.variant == variant) & (fp_all.dtype == dtype)]
with c4:
    # start on the fault type this triple shows most
    worst = sel.groupby("fault_type")["n_faults"].sum().idxmax() if len(sel) else None
    fault = pick("Fault type", list(spec.fault_types), "ex_fault", default=worst)
feats = list(spec.region_features)
one = sel[sel.fault_type == fault]

MATCHER = MatcherConfig()  # what the matcher serves and warns at, for the labels
overall = pool(one.assign(all="all"), ["all"])
# A build without noisy replays (`optwin build --replays 0`) counts each case's deterministic emulation as
# its one "replay" (fingerprints.aggregate): its numbers are cases and emulation faults, and say so.
made = ctx.builds.loc[ctx.builds["build_id"].astype(str).isin(set(one["build_id"].astype(str))), "replays"]
# a NULL count (a build from before the column, migrated) is unknown, not --replays 0
emulated = len(made) > 0 and bool(made.notna().all() and (made == 0).all())
m1, m2, m3, m4, m5 = st.columns(5)
m1.metric("Regions", int(one["region"].nunique()))
m2.metric("Emulated cases" if emulated else "Replays", int(one["n_replays"].sum()),
          help="Cases, each replayed once by the deterministic emulation: the build made no noisy replays "
               "(--replays 0)." if emulated else "Noisy replays of the cases in these regions.")
m3.metric("Faulting cases" if emulated else "Faulting replays", int(one["n_faults"].sum()))
m4.metric("P(fault), matcher", f"{overall['p_matcher'].iloc[0]:.4f}" if len(overall) else "n/a",
          help="What the matcher serves, pooled over the regions: the replays' rate blended with the deterministic "
               f"emulation (det_weight {MATCHER.det_weight}). The sidecar warns at {MATCHER.threshold}.")
m5.metric("P(fault), emulation" if emulated else "P(fault), replays",
          f"{overall['probability'].iloc[0]:.4f}" if len(overall) else "n/a",
          help="Faulting cases / cases of the deterministic emulation: the build made no noisy replays "
               "(--replays 0)." if emulated else "Faulting replays / replays: the noisy replays alone.")
if one.empty:
    st.info(f"no fingerprints for {op}/{variant}/{dtype} {fault} in build {ctx.build}")
    st.stop()
value = st.radio("Plot", list(charts.LABELS), key="ex_value", horizontal=True, format_func=charts.LABELS.get,
                 help="The matcher's probability is what warns; the replays' rate is the evidence, with its interval.")

st.subheader("Fault probability over two features")
a1, a2 = st.columns(2)
with a1:
    fx = pick("X feature", feats, "ex_fx")
with a2:
    fy = pick("Y feature", [f for f in feats if f != fx] or feats, "ex_fy")
cells = pool(one, [f"bin:{fx}", fx, f"bin:{fy}", fy]) if fx != fy else pool(one, [f"bin:{fx}", fx])
if fx != fy:
    st.altair_chart(charts.heatmap(cells, fx, fy, value))
    st.caption(f"Pooled over {', '.join(f for f in feats if f not in (fx, fy)) or 'nothing'}; "
               "right: width of the 95% interval (wide = little evidence).")

st.subheader("Along one feature")
b1, b2 = st.columns([1, 2])
with b1:
    fc = pick("Feature", feats, "ex_curve")
    threshold = st.slider("Boundary threshold", 0.05, 0.95, MATCHER.threshold, 0.05, key="ex_threshold",
                          help=f"Of {charts.LABELS[value]}; the matcher warns at {MATCHER.threshold}.")
points = pool(one, [f"bin:{fc}", fc])
edge = boundary(points, fc, threshold, value)
with b1:
    st.metric("Boundary", f"{fc} ≥ {edge:.4g}" if edge is not None else "not reached")
with b2:
    st.altair_chart(charts.curve(points, fc, threshold, value=value), width="stretch")

st.subheader("Fault types side by side")
by_type = pool(sel, ["fault_type", f"bin:{fc}", fc])
st.altair_chart(charts.fault_types_side_by_side(by_type, fc, threshold, value))

st.subheader(f"Variants of {op} compared ({dtype}, {fault})")
variants = fp_all[(fp_all.dtype == dtype) & (fp_all.fault_type == fault)]
by_variant = pool(variants, ["variant", f"bin:{fc}", fc])
st.altair_chart(charts.curve(by_variant, fc, threshold, color="variant", value=value), width="stretch")
summary = pool(variants, ["variant"]).rename(columns=charts.LABELS)
st.dataframe(summary, hide_index=True, key="ex_variants")

st.subheader("Regions")
st.caption("One row per replayed region of this op/variant/dtype and fault type: the probability the matcher serves "
           "for a sketch that falls in it, and the replays behind it.")
regions = pool(one, ["region", *feats]).sort_values("p_matcher", ascending=False, kind="stable")
st.dataframe(regions.rename(columns=charts.LABELS), hide_index=True, key="ex_regions")
