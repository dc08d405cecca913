"""Altair charts of the dashboard: pure functions from DataFrames (as `data.py` returns them) to charts.

    python -c "from optwin.dashboard import charts; help(charts)"

Region features span decades, so quantitative feature axes use a symlog scale (features can be 0 or
negative); binned axes are ordinal, ordered by bin and labelled by the bin's lower edge.
"""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

_FLOOR = 1e-18  # relative errors of 0 plotted on a log axis


def _log_ticks(values: pd.Series) -> list[float]:
    """0 and the powers of 10 spanning the positive data: symlog axes otherwise get two ticks."""
    pos = values[values > 0]
    if pos.empty:
        return [0.0]
    lo, hi = math.floor(math.log10(float(pos.min()))), math.ceil(math.log10(float(pos.max())))
    return [0.0] + [10.0**k for k in range(lo, hi + 1)]


def _feature_x(df: pd.DataFrame, feature: str, title: str) -> alt.X:
    return alt.X(f"{feature}:Q", scale=alt.Scale(type="symlog"), title=title,
                 axis=alt.Axis(values=_log_ticks(df[feature]), format="~g"))


def edge_label(value: float) -> str:
    """Short label of a bin's lower edge: '≥ 1.41e+02'."""
    return f"≥ {value:.3g}"


# The two probabilities a fingerprint cell has (data.pool): what the matcher serves, and the replays' rate alone
LABELS = {"p_matcher": "P(fault), matcher", "probability": "P(fault), replays"}


def _prob_tooltips(df: pd.DataFrame) -> list[alt.Tooltip]:
    return [alt.Tooltip(f"{c}:Q", format=".3f", title=t) for c, t in LABELS.items() if c in df]


def heatmap(cells: pd.DataFrame, fx: str, fy: str, value: str = "probability") -> alt.HConcatChart:
    """Pooled fault probability (`value`: "p_matcher" or "probability", see LABELS) over two binned features,
    beside the width of the replays' 95% interval.

    `cells` has columns `bin:<fx>`, `<fx>`, `bin:<fy>`, `<fy>`, probability, p_matcher, ci_low, ci_high,
    ci_width, n_faults, n_replays (data.pool over those four).
    """
    df = cells.copy()
    df["x"] = [edge_label(v) for v in df[fx]]
    df["y"] = [edge_label(v) for v in df[fy]]
    x_order = [edge_label(v) for v in df.sort_values(f"bin:{fx}")[fx].drop_duplicates()]
    y_order = [edge_label(v) for v in df.sort_values(f"bin:{fy}", ascending=False)[fy].drop_duplicates()]
    base = alt.Chart(df).encode(
        x=alt.X("x:O", sort=x_order, title=f"{fx} (bin lower edge)"),
        y=alt.Y("y:O", sort=y_order, title=f"{fy} (bin lower edge)"),
        tooltip=[
            alt.Tooltip("x:N", title=fx),
            alt.Tooltip("y:N", title=fy),
            *_prob_tooltips(df),
            alt.Tooltip("ci_low:Q", format=".3f", title="replays ci_low"),
            alt.Tooltip("ci_high:Q", format=".3f", title="replays ci_high"),
            alt.Tooltip("n_faults:Q"),
            alt.Tooltip("n_replays:Q"),
        ],
    )
    prob = base.mark_rect().encode(
        color=alt.Color(f"{value}:Q", scale=alt.Scale(domain=[0, 1], scheme="reds"), title=LABELS[value])
    ).properties(title=LABELS[value], width=360, height=300)
    width = base.mark_rect().encode(
        color=alt.Color("ci_width:Q", scale=alt.Scale(domain=[0, 1], scheme="greys"), title="95% CI width")
    ).properties(title="Interval width of the replays' rate (95% Wilson)", width=360, height=300)
    return alt.hconcat(prob, width).resolve_scale(color="independent")


def curve(points: pd.DataFrame, feature: str, threshold: float, color: str | None = None,
          value: str = "probability") -> alt.LayerChart:
    """Pooled probability (`value`, see LABELS) along one feature, the threshold and the boundary marked; with
    the replays' rate, its 95% band too (the Wilson interval is of the replay counts, not of the matcher's blend).

    `points`: columns `<feature>`, `value`, ci_low, ci_high (and `color` if given). The boundary
    is the lowest feature value whose probability reaches the threshold, per color group.
    """
    df = points.dropna(subset=[value]).copy()
    x = _feature_x(df, feature, f"{feature} (bin lower edge)")
    enc = {"color": alt.Color(f"{color}:N")} if color else {}
    base = alt.Chart(df).encode(x=x, **enc)
    y = alt.Y(f"{value}:Q", scale=alt.Scale(domain=[0, 1]), title=LABELS[value])
    line = base.mark_line(point=True).encode(
        y=y,
        tooltip=[alt.Tooltip(f"{feature}:Q", format=".3g"), *_prob_tooltips(df),
                 alt.Tooltip("ci_low:Q", format=".3f", title="replays ci_low"),
                 alt.Tooltip("ci_high:Q", format=".3f", title="replays ci_high")]
        + ([alt.Tooltip(f"{color}:N")] if color else []),
    )
    layers = [line]
    if value == "probability":
        layers.insert(0, base.mark_area(opacity=0.2).encode(y=alt.Y("ci_low:Q", scale=alt.Scale(domain=[0, 1])), y2="ci_high:Q"))
    thr = alt.Chart(pd.DataFrame({"threshold": [threshold]})).mark_rule(strokeDash=[4, 4], color="gray").encode(y="threshold:Q")
    hit = df[df[value] >= threshold]
    groups = [color] if color else []
    if groups and len(hit):
        edges = hit.groupby(groups, as_index=False)[feature].min()
    else:
        edges = pd.DataFrame({feature: [hit[feature].min()]}) if len(hit) else pd.DataFrame({feature: []})
    rule = alt.Chart(edges).mark_rule(strokeWidth=2).encode(x=x, **enc, tooltip=[alt.Tooltip(f"{feature}:Q", format=".3g", title="boundary")])
    return alt.layer(*layers, thr, rule).properties(height=280)


def fault_types_side_by_side(points: pd.DataFrame, feature: str, threshold: float, value: str = "probability") -> alt.Chart:
    """One small curve per fault type (column facets), sharing the feature axis; `value` as in `curve`."""
    df = points.dropna(subset=[value])
    x = _feature_x(df, feature, feature)
    y = alt.Y(f"{value}:Q", scale=alt.Scale(domain=[0, 1]), title=LABELS[value])
    layers = [alt.Chart().mark_line(point=True).encode(x=x, y=y)]
    if value == "probability":
        layers.insert(0, alt.Chart().mark_area(opacity=0.2).encode(x=x, y=alt.Y("ci_low:Q", scale=alt.Scale(domain=[0, 1])), y2="ci_high:Q"))
    thr = alt.Chart().mark_rule(strokeDash=[4, 4], color="gray").encode(y=alt.datum(threshold))
    return alt.layer(*layers, thr, data=df).properties(width=260, height=220).facet(column=alt.Column("fault_type:N", title=None))


def error_quantiles(row: dict, tau: float | None) -> alt.LayerChart:
    """The replays' relative error distribution of one case: deterministic, q50, q90, max (log axis)."""
    names = [("deterministic", "det_rel_error"), ("replay q50", "err_q50"), ("replay q90", "err_q90"), ("replay max", "err_max")]
    recs = []
    for n, k in names:
        v = row.get(k)
        if v is None:
            continue
        v = float(v)
        # inf (a NaN output counts as total loss) cannot sit on a log axis: drawn at the top, labelled
        shown = max(v, _FLOOR) if math.isfinite(v) else None
        recs.append({"statistic": n, "rel_error": f"{v:.3e}", "shown": shown})
    df = pd.DataFrame(recs, columns=["statistic", "rel_error", "shown"])
    top = max([r["shown"] for r in recs if r["shown"] is not None] + [1.0])
    df["shown"] = df["shown"].fillna(top * 10)
    y = alt.Y("shown:Q", scale=alt.Scale(type="log"), title="relative error")
    bars = alt.Chart(df).mark_bar().encode(
        x=alt.X("statistic:N", sort=[n for n, _ in names], title=None), y=y,
        tooltip=["statistic:N", "rel_error:N"],
    )
    layers = [bars]
    if tau is not None:
        layers.append(alt.Chart(pd.DataFrame({"tau": [tau]})).mark_rule(color="red", strokeDash=[4, 4]).encode(
            y="tau:Q", tooltip=[alt.Tooltip("tau:Q", format=".3e", title="precision_loss tau")]))
    return alt.layer(*layers).properties(height=260)


def live_risk(points: pd.DataFrame) -> alt.LayerChart:
    """Per-stream risk (max fault probability) over time; `eta_s` in the tooltip and as labels. One line per
    stream and sidecar run: a restarted sidecar's stream starts a new line rather than joining the old one."""
    base = alt.Chart(points).encode(
        x=alt.X("t:Q", title="t (s)"),
        color=alt.Color("stream:N"),
        detail=alt.Detail("run:N"),
    )
    line = base.mark_line(point=True).encode(
        y=alt.Y("risk:Q", scale=alt.Scale(domain=[0, 1]), title="risk = max P(fault)"),
        tooltip=["stream:N", "run:N", alt.Tooltip("t:Q", format=".2f"), alt.Tooltip("risk:Q", format=".3f"),
                 alt.Tooltip("eta_s:Q", format=".1f", title="forecast eta (s)"), "fault_type:N"],
    )
    return alt.layer(line).properties(height=300)


def compare_scatter(diff: pd.DataFrame) -> alt.Chart:
    """The matcher's probability in build A vs build B for fingerprints present in both, colored by op."""
    both = diff.dropna(subset=["p_matcher_a", "p_matcher_b"])
    pts = alt.Chart(both).mark_circle(size=40, opacity=0.6).encode(
        x=alt.X("p_matcher_a:Q", scale=alt.Scale(domain=[0, 1]), title="P(fault), matcher, build A"),
        y=alt.Y("p_matcher_b:Q", scale=alt.Scale(domain=[0, 1]), title="P(fault), matcher, build B"),
        color="op:N",
        tooltip=["op:N", "variant:N", "dtype:N", "region:N", "fault_type:N",
                 alt.Tooltip("p_matcher_a:Q", format=".3f"), alt.Tooltip("p_matcher_b:Q", format=".3f"),
                 alt.Tooltip("p_replays_a:Q", format=".3f"), alt.Tooltip("p_replays_b:Q", format=".3f")],
    )
    diag = alt.Chart(pd.DataFrame({"p": [0.0, 1.0]})).mark_line(color="gray", strokeDash=[4, 4]).encode(x="p:Q", y="p:Q")
    return alt.layer(diag, pts).properties(height=320)
