"""Rejected sidecar records change nothing: no stream is created, none is evicted, none is touched.

    python -m pytest -q tests/test_sidecar_rejects.py
"""

from __future__ import annotations

import pytest

from _matcher_fixture import RMS_SKETCH as SK, rms_record as rec
from optwin.fingerprints.sidecar import SidecarConfig, SidecarState


# Each is wrong in one field checked after the names: before the fix the stream was created (evicting at the cap)
# before these checks ran.
BAD = [
    pytest.param({"t": "later"}, id="t-string"),
    pytest.param({"t": None, "params": [1, 2]}, id="params-list"),
    pytest.param({"t": True}, id="t-bool"),
    pytest.param({"sketch": {**SK, "absmax": -1.0}}, id="sketch"),
]


@pytest.mark.parametrize("bad", BAD)
def test_a_rejected_record_neither_creates_nor_evicts_a_stream(db, bad):
    st = SidecarState(db, config=SidecarConfig(max_streams=3))
    for i in range(6):
        assert "error" not in st.observe_record(rec("a", t=100.0 + i))
    for s in ("b", "c"):
        assert "error" not in st.observe_record(rec(s, t=100.0))
    a = st.streams[("a", "rmsnorm", "native-dtype", "float16")]
    for k in range(3):  # new names at the cap
        assert "error" in st.observe_record(rec(f"junk{k}", **bad))
    assert "error" in st.observe_record(rec("b", **bad))  # an existing stream: not moved to the recently seen end
    assert [k[0] for k in st.streams] == ["a", "b", "c"]
    assert st.streams[("a", "rmsnorm", "native-dtype", "float16")] is a and a.n_observed == 6
    assert st.metrics.streams_evicted == {"capacity": 0, "idle": 0} and st.metrics.records_error == 4
    assert "optwin_sidecar_streams 3\n" in st.prometheus(0.0)
    # the next valid new stream evicts the least recently seen valid one, a
    assert "error" not in st.observe_record(rec("d", t=100.0))
    assert [k[0] for k in st.streams] == ["b", "c", "d"]
    st.close()
