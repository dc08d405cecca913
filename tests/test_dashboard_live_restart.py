"""The Live page across restarts of the real sidecar (optwin.fingerprints.sidecar on one loopback port).

    python -m pytest -x -q tests/test_dashboard_live_restart.py

A restarted sidecar numbers its warnings from 1 again. The page must notice (its cursor is from the
previous run) and show the new run's warnings, keeping the earlier ones marked with their run.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from test_dashboard_pages import app, metrics

# an rmsnorm float16 sketch far past x*x's overflow at |x| = 256: every record warns at once
HOT = {"numel": 1024.0, "rows": 4.0, "absmax": 1e4, "rms": 3e3, "nonfinite": 0.0, "hidden": 256.0,
       "max_row_rms": 3e3, "weight_absmax": 1.0}


def _raise(url: str, prefix: str, n: int) -> None:
    from optwin.fingerprints.client import HTTP

    recs = [{"stream": f"{prefix}{i}", "op": "rmsnorm", "variant": "native-dtype", "dtype": "float16",
             "sketch": HOT, "t": 1.0} for i in range(n)]
    code, body = HTTP(url).request("POST", "/v1/observe", json.dumps(recs).encode())
    assert code == 200 and all(a["warn"] for a in json.loads(body))


def test_live_follows_a_restarted_sidecar(tmp_path: Path) -> None:
    from _matcher_fixture import cached_db
    from optwin.fingerprints.sidecar import SidecarThread

    db = cached_db(str(tmp_path / "fp.duckdb"))
    with socket.socket() as s:  # one port for every run, as a restarted `optwin serve --listen` keeps it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    listen, url = f"tcp://127.0.0.1:{port}", f"http://127.0.0.1:{port}"

    with SidecarThread(db, listen=listen):
        _raise(listen, "first", 5)
        at = app(None, "pages/4_Live.py", sidecar=url)
        assert metrics(at) == {"Warnings": "5", "Streams": "5", "Last seq": "5"}
        at.run()  # polling the same run again is not a restart
        assert metrics(at) == {"Warnings": "5", "Streams": "5", "Last seq": "5"}
        assert not any("restarted" in c.value for c in at.caption)

    with SidecarThread(db, listen=listen):  # fewer warnings than the old cursor: since=5 alone gets nothing
        _raise(listen, "second", 3)
        at.run()
        assert not at.exception
        assert metrics(at) == {"Warnings": "8", "Streams": "8", "Last seq": "3"}
        shown = at.dataframe[-1].value
        assert sorted(shown[shown["run"] == 2]["stream"]) == ["second0", "second1", "second2"]
        assert sorted(shown[shown["run"] == 1]["stream"]) == [f"first{i}" for i in range(5)]
        assert any("restarted 1×" in c.value and "5 of the warnings" in c.value for c in at.caption)

    with SidecarThread(db, listen=listen):  # more warnings than the cursor: seq 3 now names another warning
        _raise(listen, "second", 3)  # the same streams and t as the previous run: only the sidecar's time differs
        _raise(listen, "third", 4)
        at.run()
        assert metrics(at) == {"Warnings": "15", "Streams": "12", "Last seq": "7"}
        shown = at.dataframe[-1].value
        assert sorted(shown[shown["run"] == 3]["seq"]) == list(range(1, 8))
        at.run()
        assert metrics(at)["Warnings"] == "15"
