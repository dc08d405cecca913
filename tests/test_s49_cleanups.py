"""The Compare builds page indexes each operator's fingerprints once per build, not twice.

    python -m pytest -q tests/test_s49_cleanups.py

The page asked for the comparison (served probabilities: one `Matcher.from_rows` per op of each build) and then
for each build's binning errors, which indexed every op again only to see whether the matcher refuses it: two
matcher builds per (build, op) on every page load that misses the cache. The real page under AppTest, on a small
real DuckDB of two builds, with `Matcher.from_rows` counted.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import duckdb
import streamlit as st
from streamlit.testing.v1 import AppTest

from optwin.fingerprints.matcher import Matcher
from test_dashboard_fixture import direct, make_db
from test_dashboard_pages import APP


def _count_from_rows(monkeypatch) -> Counter:
    """Calls of Matcher.from_rows by (build, op) of the rows it was given (each call gets one op's rows)."""
    calls: Counter = Counter()
    orig = Matcher.from_rows.__func__

    def counted(cls, rows, *args, **kwargs):
        rows = list(rows)
        calls.update({(r["build_id"], r["op"]) for r in rows})
        return orig(cls, rows, *args, **kwargs)

    monkeypatch.setattr(Matcher, "from_rows", classmethod(counted))
    return calls


def _compare_page(db: Path, calls: Counter) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["optwin_db"] = str(db)
    at.run()
    st.cache_data.clear()  # results cached by earlier tests or the first page would hide the page's own calls
    calls.clear()
    at.switch_page("pages/5_Compare_builds.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_compare_page_builds_each_ops_matcher_once_per_build(tmp_path: Path, monkeypatch) -> None:
    db = make_db(tmp_path / "fp.duckdb")
    calls = _count_from_rows(monkeypatch)
    at = _compare_page(db, calls)
    pairs = {(b, op) for b, op in direct(db, "SELECT DISTINCT build_id, op FROM fingerprints")}
    assert len(pairs) == 4  # two builds of rmsnorm and softmax
    assert calls == Counter(dict.fromkeys(pairs, 1))
    assert not at.error
    changed = at.dataframe[0].value.query("status == 'changed'")  # in both builds: served by both matchers
    assert len(changed) and changed[["p_matcher_a", "p_matcher_b"]].notna().all().all()


def test_compare_page_still_names_a_refused_op_once(tmp_path: Path, monkeypatch) -> None:
    # the refused op's error now comes from the same pass as the probabilities: still shown, once, and the
    # other op still has its probabilities
    db = make_db(tmp_path / "fp.duckdb")
    with duckdb.connect(str(db)) as c:  # build-1's softmax regions as an older catalog binned them: one bin fewer
        c.execute(r"UPDATE fingerprints SET region = regexp_replace(region, '\|[^|]*$', '') "
                  "WHERE op = 'softmax' AND build_id = 'build-1'")
    calls = _count_from_rows(monkeypatch)
    at = _compare_page(db, calls)
    assert max(calls.values()) == 1
    assert len(at.error) == 1 and "softmax (build build-1)" in at.error[0].value, [e.value for e in at.error]
    diff = at.dataframe[0].value
    assert diff.loc[diff["op"] == "rmsnorm", "p_matcher_a"].notna().any()
