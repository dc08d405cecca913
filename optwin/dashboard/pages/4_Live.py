"""Live: warnings from the prediction sidecar as they arrive; per-stream risk over time and forecast.

    streamlit run optwin/dashboard/app.py -- --db fingerprints.duckdb --sidecar http://127.0.0.1:8787
    (a sidecar with --token: OPTWIN_SIDECAR_TOKEN=... in the environment, or the token field)
"""

from __future__ import annotations

import streamlit as st

from optwin.dashboard import charts, live
from optwin.dashboard.common import page_context, sidecar_token, sidecar_url

st.title("Live")
page_context(required=False)  # the sidebar; the live view needs only the sidecar

default = sidecar_url() or ""
if "live_url" not in st.session_state:
    st.session_state["live_url"] = default
if "live_token" not in st.session_state:
    st.session_state["live_token"] = sidecar_token() or ""
c1, c2 = st.columns([2, 1])
with c1:
    url = st.text_input("Sidecar URL", key="live_url", placeholder="http://127.0.0.1:8787",
                        help="http://HOST:PORT or tcp://HOST:PORT, unix:///path.sock, as `optwin serve --listen`")
url = url.strip().rstrip("/")
with c2:
    token = st.text_input("Sidecar token", key="live_token", type="password",
                          help="The sidecar's --token (default: --sidecar-token / OPTWIN_SIDECAR_TOKEN)").strip() or None
auto = st.toggle("Refresh every 2 s", value=True, key="live_auto")
if not url:
    st.info("No sidecar configured: start one with `optwin serve --db DB` and the dashboard with "
            "`optwin dashboard --db DB --sidecar http://127.0.0.1:PORT`, or enter its URL above.")
    st.stop()
if (bad := live.check_url(url)) is not None:
    st.error(bad)
    st.stop()

if st.session_state.get("live_for") != url:  # another sidecar: start over
    st.session_state.update(live_for=url, live_feed=live.Feed(), live_error=None)


def _view() -> None:
    feed: live.Feed = st.session_state["live_feed"]
    got = feed.poll(lambda since: live.fetch_warnings(url, since, token))
    st.session_state["live_error"] = got.error
    if got.error:
        st.info(got.error)
    df = live.table(feed.warnings)
    m = st.columns(3)
    m[0].metric("Warnings", len(df))
    m[1].metric("Streams", int(df["stream"].nunique()))
    m[2].metric("Last seq", feed.cursor)
    if feed.restarts:
        older = int((df["run"] < feed.run).sum())
        st.caption(f"The sidecar restarted {feed.restarts}× (its warning numbers started over): {older} of the warnings "
                   f"below are from earlier runs (column run < {feed.run}); Last seq counts the current run.")
    if df.empty:
        st.caption(f"no warnings from {url} yet")
        return
    st.altair_chart(charts.live_risk(df.dropna(subset=["risk"])), width="stretch")
    latest = live.latest_per_stream(df)
    st.markdown("**Per stream, latest** (eta_s: forecast seconds until the stream reaches a fault region)")
    st.dataframe(latest[["stream", "run", "op", "variant", "dtype", "t", "risk", "fault_type", "eta_s", "reason"]],
                 hide_index=True)
    st.markdown("**Warnings, newest first**")
    st.dataframe(df.sort_values(["run", "seq"], ascending=False), hide_index=True)


st.fragment(_view, run_every=2.0 if auto else None)()
