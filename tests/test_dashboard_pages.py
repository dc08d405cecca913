"""Every dashboard page under streamlit.testing's AppTest, against a small real database.

    python -m pytest -x -q tests/test_dashboard_pages.py

Checks: no exception, widgets found by key, and the numbers a page shows equal a direct DuckDB
query on the same file. The Live page polls the real sidecar fed a drifting stream, and a small
loopback server speaking `GET /v1/warnings?since=SEQ` for the incremental-polling checks.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from streamlit.testing.v1 import AppTest

from optwin.twin import TWIN_VERSION
from test_dashboard_fixture import direct, make_db, served

APP = str(Path(__file__).resolve().parents[1] / "optwin" / "dashboard" / "app.py")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_db(tmp_path_factory.mktemp("pages") / "fp.duckdb")


def app(db: Path | str | None, page: str | None = None, sidecar: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    if db is not None:
        at.session_state["optwin_db"] = str(db)
    if sidecar is not None:
        at.session_state["optwin_sidecar"] = sidecar
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_overview_numbers_match_sql(db: Path) -> None:
    at = app(db)
    assert at.title[0].value == "Overview"
    assert at.selectbox(key="build").value == "build-2"
    cases, replays, ops = direct(db, "SELECT count(*), sum(o.replays), count(DISTINCT c.op) FROM cases c JOIN outcomes o "
                                     "USING (build_id, case_id) WHERE build_id = 'build-2'")[0]
    regions = direct(db, "SELECT count(DISTINCT op||variant||dtype||'/'||region) FROM fingerprints WHERE build_id = 'build-2'")[0][0]
    m = metrics(at)
    assert m == {"Builds": "2", "Operators": str(ops), "Cases": str(cases), "Replays": str(replays), "Regions": str(regions)}
    builds = at.dataframe[0].value
    assert list(builds["build_id"]) == ["build-2", "build-1"] and "code_version" in builds
    # picking the older build changes the numbers to that build's
    at.selectbox(key="build").set_value("build-1").run()
    cases1 = direct(db, "SELECT count(*) FROM cases WHERE build_id = 'build-1'")[0][0]
    assert metrics(at)["Cases"] == str(cases1) != str(cases)


def test_a_build_of_other_twins_is_flagged_in_the_sidebar(db: Path, tmp_path: Path) -> None:
    import shutil

    import duckdb

    assert not app(db).sidebar.warning  # the fixture's builds carry this optwin's twin version
    old = tmp_path / "old.duckdb"
    shutil.copyfile(db, old)
    with duckdb.connect(str(old)) as conn:
        conn.execute("UPDATE builds SET twin_version = '1' WHERE build_id = 'build-1'")
    at = app(old)
    assert not at.sidebar.warning  # build-2, the newest, is current
    at.selectbox(key="build").set_value("build-1").run()
    assert [w.value for w in at.sidebar.warning] == [
        "build build-1 was replayed by twin version 1; this optwin's twins are version "
        f"{TWIN_VERSION}: `optwin build` replays them anew"]
    unknown = tmp_path / "unknown.duckdb"  # builds without a version (every row NULL: None, not NaN)
    shutil.copyfile(db, unknown)
    with duckdb.connect(str(unknown)) as conn:
        conn.execute("UPDATE builds SET twin_version = NULL")
    at = app(unknown)
    assert [w.value for w in at.sidebar.warning] == [
        "build build-2 was replayed by twin version unknown; this optwin's twins are version "
        f"{TWIN_VERSION}: `optwin build` replays them anew"]


def test_overview_shows_what_the_matcher_serves_after_a_build_of_some_ops(tmp_path: Path) -> None:
    import duckdb

    path = make_db(tmp_path / "fp.duckdb")
    op, variant, dtype = direct(path, "SELECT op, variant, dtype FROM fingerprints WHERE build_id = 'build-2' "
                                      "ORDER BY 1, 2, 3 LIMIT 1")[0]
    with duckdb.connect(str(path)) as c:  # build-2 as a build of the other triples only
        for table in ("fingerprints", "representatives"):
            c.execute(f"DELETE FROM {table} WHERE build_id = 'build-2' AND op = ? AND variant = ? AND dtype = ?",
                      [op, variant, dtype])
    plain = app(make_db(tmp_path / "one.duckdb"))  # every triple from the newest build: nothing to say
    assert "What the matcher serves" not in [h.value for h in plain.subheader]
    at = app(path)
    assert "What the matcher serves" in [h.value for h in at.subheader]
    served = next(d.value for d in at.dataframe if "n_regions" in d.value.columns)
    row = served[(served["op"] == op) & (served["variant"] == variant) & (served["dtype"] == dtype)]
    assert list(row["build_id"]) == ["build-1"]
    assert set(served["build_id"]) == {"build-1", "build-2"}
    from optwin.fingerprints.matcher import Matcher

    m = Matcher.open(path)  # the page says what the matcher does
    assert {t: b for t, b in m.builds.items()} == {
        (r.op, r.variant, r.dtype): r.build_id for r in served.itertuples()}


def test_operator_explorer_pooled_probability_and_boundary(db: Path) -> None:
    at = app(db, "pages/2_Operator_explorer.py")
    for key in ("ex_op", "ex_variant", "ex_dtype", "ex_fault", "ex_fx", "ex_fy", "ex_curve"):
        assert at.selectbox(key=key) is not None
    at.selectbox(key="ex_variant").set_value("native-dtype").run()
    at.selectbox(key="ex_fault").set_value("precision_loss").run()
    assert not at.exception
    k, n, regions = direct(db, "SELECT sum(n_faults), sum(n_replays), count(*) FROM fingerprints WHERE build_id = 'build-2' "
                               "AND op = 'rmsnorm' AND variant = 'native-dtype' AND dtype = 'float16' "
                               "AND fault_type = 'precision_loss'")[0]
    m = metrics(at)
    assert m["Regions"] == str(regions) and m["Replays"] == str(n) and m["Faulting replays"] == str(k)
    assert m["P(fault), replays"] == f"{k / n:.4f}"
    # the replays' rate and its boundary at 0.5 (the matcher's probability: test_dashboard_matcher_probability.py)
    at.radio(key="ex_value").set_value("probability").run()
    at.slider(key="ex_threshold").set_value(0.5).run()
    m = metrics(at)
    assert m["Boundary"].startswith("absmax ≥ ")
    edge = float(m["Boundary"].split("≥")[1])
    assert 2.0**9 <= edge <= 2.0**12.5  # the fixture's boundary for build-2
    # a higher threshold can only move the boundary up
    at.slider(key="ex_threshold").set_value(0.9).run()
    assert float(metrics(at)["Boundary"].split("≥")[1]) >= edge
    # other axes and another op render too
    at.selectbox(key="ex_fx").set_value("max_row_rms").run()
    at.selectbox(key="ex_op").set_value("softmax").run()
    assert not at.exception
    assert at.selectbox(key="ex_variant").value == "torch"
    assert at.selectbox(key="ex_fx").options == ["max", "min_row_max", "masked_rows", "peaked_frac"]


def test_cases_drill_down_and_snippet(db: Path) -> None:
    at = app(db, "pages/3_Cases.py")
    at.selectbox(key="cs_variant").set_value("native-dtype").run()
    at.selectbox(key="cs_fault").set_value("precision_loss").run()
    n = direct(db, "SELECT count(*) FROM representatives WHERE build_id = 'build-2' AND op = 'rmsnorm' "
                   "AND variant = 'native-dtype' AND dtype = 'float16' AND fault_type = 'precision_loss'")[0][0]
    assert metrics(at)["Representative failing cases"] == str(n) and n > 0
    case_id = at.selectbox(key="cs_case").value
    q50, idx, seed, family = direct(db, "SELECT o.err_q50, c.case_index, c.seed, c.family FROM cases c JOIN outcomes o "
                                        "USING (build_id, case_id) WHERE build_id = 'build-2' AND case_id = ?", [case_id])[0]
    assert metrics(at)["err_q50"] == f"{q50:.3g}"
    code = at.code[0].value
    gen = "boundary_sweep" if family.startswith("boundary:") else "default_sweep"
    assert f"{gen}('rmsnorm', 'float16', {idx + 1}, {seed})[{idx}]" in code
    assert "twin.run('rmsnorm', 'native-dtype', 'float16'" in code
    compile(code, "<snippet>", "exec")
    # the sketch table holds the stored sketch
    sketch = at.dataframe[1].value  # cs_table, cs_sketch, cs_faults
    stored = json.loads(direct(db, "SELECT sketch FROM cases WHERE build_id = 'build-2' AND case_id = ?", [case_id])[0][0])
    assert dict(zip(sketch["feature"], sketch["value"])) == pytest.approx(stored)
    other = int(at.selectbox(key="cs_case").options[-1].split(":")[0])  # options show formatted labels
    at.selectbox(key="cs_case").set_value(other).run()
    assert not at.exception and str(other) in at.code[0].value


def test_compare_builds_counts_match_sql(db: Path) -> None:
    at = app(db, "pages/5_Compare_builds.py")
    assert (at.selectbox(key="cmp_a").value, at.selectbox(key="cmp_b").value) == ("build-1", "build-2")
    key = "op, variant, dtype, region, fault_type"
    rows = direct(db, f"SELECT {key}, a.probability, b.probability FROM "
                      f"(SELECT * FROM fingerprints WHERE build_id='build-1') a JOIN "
                      f"(SELECT * FROM fingerprints WHERE build_id='build-2') b USING ({key})")
    # changed: the replays' rate or what the matcher serves for the cell (the deterministic blend) differs
    sa, sb = served(db, "build-1"), served(db, "build-2")
    both = (len(rows), sum(r[5] != r[6] or sa[r[:5]] != sb[r[:5]] for r in rows))
    new = direct(db, f"SELECT count(*) FROM (SELECT {key} FROM fingerprints WHERE build_id='build-2' EXCEPT "
                     f"SELECT {key} FROM fingerprints WHERE build_id='build-1')")[0][0]
    removed = direct(db, f"SELECT count(*) FROM (SELECT {key} FROM fingerprints WHERE build_id='build-1' EXCEPT "
                         f"SELECT {key} FROM fingerprints WHERE build_id='build-2')")[0][0]
    m = metrics(at)
    assert m["Fingerprints changed"] == str(both[1]) and m["Fingerprints same"] == str(both[0] - both[1])
    assert m["Fingerprints new"] == str(new) and m["Fingerprints removed"] == str(removed)
    at.selectbox(key="cmp_op").set_value("softmax").run()
    sm = direct(db, "SELECT count(*) FROM (SELECT op, variant, dtype, region, fault_type FROM fingerprints WHERE "
                    "build_id='build-2' AND op='softmax' EXCEPT SELECT op, variant, dtype, region, fault_type FROM "
                    "fingerprints WHERE build_id='build-1')")[0][0]
    assert metrics(at)["Fingerprints new"] == str(sm)
    at.multiselect(key="cmp_status").set_value(["new"]).run()
    assert set(at.dataframe[0].value["status"]) <= {"new"}


def test_compare_with_one_build_says_so(tmp_path: Path) -> None:
    path = make_db(tmp_path / "one.duckdb", n_builds=1, n_cases=10)
    at = app(path, "pages/5_Compare_builds.py")
    assert "nothing to compare" in at.info[0].value


def test_missing_and_foreign_files_are_messages(tmp_path: Path) -> None:
    at = app(tmp_path / "missing.duckdb")
    assert "no fingerprint database at" in at.error[0].value and "optwin build" in at.error[0].value
    junk = tmp_path / "junk.duckdb"
    junk.write_text("not a database\n" * 100)
    for page in (None, "pages/2_Operator_explorer.py", "pages/3_Cases.py", "pages/5_Compare_builds.py"):
        at = app(junk, page)
        assert "junk.duckdb" in at.error[0].value
    at = app(None)
    assert "optwin dashboard --db" in at.error[0].value


def test_rebuild_underneath_is_picked_up(tmp_path: Path) -> None:
    path = make_db(tmp_path / "fp.duckdb", n_builds=1, n_cases=10)
    at = app(path)
    assert metrics(at)["Builds"] == "1"
    make_db(path, n_builds=3, n_cases=10)  # os.replace, like `optwin build`
    at.run()
    assert not at.exception
    assert metrics(at)["Builds"] == "3" and at.selectbox(key="build").value == "build-3"
    assert metrics(at)["Cases"] == str(direct(path, "SELECT count(*) FROM cases WHERE build_id = 'build-3'")[0][0])


class _Sidecar(BaseHTTPRequestHandler):
    """A loopback stand-in speaking the sidecar's warnings protocol (a real HTTP server)."""

    warnings: list[dict] = []
    seen_since: list[int] = []

    def do_GET(self) -> None:  # noqa: N802
        url = urlparse(self.path)
        if url.path != "/v1/warnings":
            self.send_error(404)
            return
        since = int(parse_qs(url.query).get("since", ["0"])[0])
        type(self).seen_since.append(since)
        body = json.dumps([w for w in type(self).warnings if w["seq"] > since]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _warning(seq: int, stream: str, t: float, p: float, eta: float | None) -> dict:
    return {"seq": seq, "stream": stream, "op": "rmsnorm", "variant": "native-dtype", "dtype": "float16",
            "warn": True, "known": True, "probability": {"nonfinite": 0.0, "precision_loss": p}, "eta_s": eta, "t": t}


def test_live_polls_the_sidecar() -> None:
    _Sidecar.warnings = [_warning(1, "layers.0.norm", 1.0, 0.6, 4.0), _warning(2, "layers.1.norm", 1.5, 0.7, None),
                         _warning(3, "layers.0.norm", 2.0, 0.9, 1.0)]
    _Sidecar.seen_since = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sidecar)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        at = app(None, "pages/4_Live.py", sidecar=url)
        assert at.text_input(key="live_url").value == url
        assert at.toggle(key="live_auto") is not None
        assert metrics(at) == {"Warnings": "3", "Streams": "2", "Last seq": "3"}
        latest = at.dataframe[0].value.set_index("stream")
        assert latest.loc["layers.0.norm", "risk"] == pytest.approx(0.9)
        assert latest.loc["layers.0.norm", "eta_s"] == pytest.approx(1.0)
        _Sidecar.warnings.append(_warning(4, "layers.2.attn", 3.0, 0.8, 2.5))
        at.run()
        assert metrics(at) == {"Warnings": "4", "Streams": "3", "Last seq": "4"}
        # asks only for what it has not seen, and again for the newest warning it has (a restart check, live.Feed)
        assert _Sidecar.seen_since[:2] == [0, 2]
    finally:
        server.shutdown()
        server.server_close()


def test_live_without_or_with_unreachable_sidecar() -> None:
    at = app(None, "pages/4_Live.py")
    assert "No sidecar configured" in at.info[-1].value
    # a port nobody listens on: bind one, close it, use it
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    at.text_input(key="live_url").set_value(f"http://127.0.0.1:{port}").run()
    assert not at.exception
    assert any("unreachable" in i.value for i in at.info)
    assert metrics(at)["Warnings"] == "0"


def test_live_shows_the_warnings_of_a_real_sidecar(tmp_path: Path) -> None:
    """The real sidecar (optwin.fingerprints.sidecar on loopback, the matcher's fixture database):
    a drifting rmsnorm stream posted over HTTP raises a forecast warning; the Live page shows exactly
    what GET /v1/warnings serves."""
    from _matcher_fixture import cached_db
    from optwin.fingerprints.client import HTTP
    from optwin.fingerprints.sidecar import SidecarConfig, SidecarThread

    base = {"numel": 256.0, "rows": 4.0, "absmax": 3.0, "rms": 1.0, "nonfinite": 0.0, "hidden": 64.0,
            "max_row_rms": 1.2, "weight_absmax": 1.0}
    db = cached_db(str(tmp_path / "fp.duckdb"))
    with SidecarThread(db, config=SidecarConfig(max_lag_s=60.0)) as sc:
        http = HTTP(sc.url)
        for i in range(80):  # |x| doubles every 10 s toward float16's x*x overflow at 256
            t = 0.5 * i
            am = 8.0 * 2 ** (t / 10)
            record = {"stream": "drift-live", "op": "rmsnorm", "variant": "native-dtype", "dtype": "float16",
                      "sketch": dict(base, absmax=am, rms=am / 3, max_row_rms=am / 2.5), "params": {}, "t": t}
            assert http.request("POST", "/v1/observe", json.dumps(record).encode())[0] == 200
        code, data = http.request("GET", "/v1/warnings?since=0")
        served = json.loads(data)
        assert code == 200 and served, "the drifting stream raised no warning"
        url = sc.url if sc.url.startswith("http") else "http://" + sc.url.split("://", 1)[1]
        at = app(None, "pages/4_Live.py", sidecar=url)
        shown = metrics(at)
        assert shown["Warnings"] == str(len(served))
        assert shown["Streams"] == str(len({w["stream"] for w in served}))
        assert shown["Last seq"] == str(max(w["seq"] for w in served))
