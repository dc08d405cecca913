"""Sidecar stream table: bounded by least-recently-seen eviction and an optional idle TTL, never by refusing a new
stream.

    python -m pytest -q tests/test_sidecar_streams.py
"""

from __future__ import annotations

import json

from _matcher_fixture import RMS_SKETCH as SK, rms_record as rec
from optwin.fingerprints.client import HTTP
from optwin.fingerprints.sidecar import SidecarConfig, SidecarState, SidecarThread


def names(st: SidecarState) -> list[str]:
    return [k[0] for k in st.streams]


def test_a_new_stream_at_the_cap_evicts_the_least_recently_seen(db):
    st = SidecarState(db, config=SidecarConfig(max_streams=3))
    for s in ("a", "b", "c", "a"):  # a seen again: b is now the least recently seen
        assert "error" not in st.observe_record(rec(s))
    out = st.observe_record(rec("d"))
    assert "error" not in out and out["stream"] == "d"  # answered, not "too many streams"
    assert names(st) == ["c", "a", "d"] and st.streams[("a", "rmsnorm", "native-dtype", "float16")].n_observed == 2
    # a record that fails validation creates no stream and so evicts none
    assert "error" in st.observe_record(rec("e", sketch={**SK, "absmax": -1.0}))
    assert "error" in st.observe_record(rec("f", op="nope"))
    assert names(st) == ["c", "a", "d"]
    assert st.metrics.streams_evicted == {"capacity": 1, "idle": 0}
    text = st.prometheus(0.0)
    assert 'optwin_sidecar_streams_evicted_total{reason="capacity"} 1' in text and "optwin_sidecar_streams 3" in text
    st.close()


def test_streams_idle_past_the_ttl_are_dropped(db):
    st = SidecarState(db, config=SidecarConfig(stream_ttl_s=10.0))
    st.observe_record(rec("old"), now=100.0)
    st.observe_record(rec("mid"), now=105.0)
    st.observe_record(rec("old"), now=106.0)  # seen again: it outlives mid
    st.observe_record(rec("new"), now=112.0)
    assert st.expire_idle(now=114.5) == 0
    assert st.expire_idle(now=115.5) == 1 and names(st) == ["old", "new"]
    assert st.expire_idle(now=116.5) == 1 and names(st) == ["new"]
    assert st.metrics.streams_evicted == {"capacity": 0, "idle": 2}
    # without a TTL nothing expires however old
    st2 = SidecarState(db)
    st2.observe_record(rec("x"), now=0.0)
    assert st2.expire_idle(now=1e9) == 0 and names(st2) == ["x"]
    st.close()
    st2.close()


def test_over_http_a_full_table_still_answers_new_streams(db):
    with SidecarThread(db, config=SidecarConfig(max_lag_s=60.0, max_streams=2)) as sc:
        http = HTTP(sc.url)
        code, data = http.request("POST", "/v1/observe", json.dumps([rec(f"s{i}") for i in range(5)]).encode())
        out = json.loads(data)
        assert code == 200 and [o.get("stream") for o in out] == [f"s{i}" for i in range(5)]
        text = http.request("GET", "/metrics")[1].decode()
        assert 'optwin_sidecar_streams_evicted_total{reason="capacity"} 3' in text
        assert "optwin_sidecar_streams 2" in text
