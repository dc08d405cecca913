"""The Streamlit exploration dashboard of a fingerprint database (entry script; pages in pages/).

    streamlit run optwin/dashboard/app.py -- --db fingerprints.duckdb [--sidecar http://127.0.0.1:8787]
    (or: optwin dashboard --db fingerprints.duckdb)
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

_PAGES = Path(__file__).parent / "pages"

st.set_page_config(page_title="optwin dashboard", layout="wide")

nav = st.navigation(
    [
        st.Page(_PAGES / "1_Overview.py", title="Overview", default=True),
        st.Page(_PAGES / "2_Operator_explorer.py", title="Operator explorer"),
        st.Page(_PAGES / "3_Cases.py", title="Cases"),
        st.Page(_PAGES / "4_Live.py", title="Live"),
        st.Page(_PAGES / "5_Compare_builds.py", title="Compare builds"),
    ]
)
nav.run()
