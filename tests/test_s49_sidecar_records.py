"""Sidecar records over real loopback HTTP: a record without "t" is refused in place and leaves its stream's
forecast as it was; an unknown variant or dtype is named in the matcher's words, before the sketch is read.

    python -m pytest -q tests/test_s49_sidecar_records.py

On the matcher fixture: rmsnorm native-dtype float16, |x| doubling every 10 s from 1 (a fault cell from ~256, t ~80 s),
as in test_sidecar_clocks.
"""

from __future__ import annotations

import json

import pytest

from optwin.errors import CatalogError
from optwin.fingerprints.client import HTTP
from optwin.fingerprints.sidecar import SidecarConfig, SidecarThread

BASE = {"numel": 1024.0, "rows": 4.0, "absmax": 1.0, "rms": 0.3, "nonfinite": 0.0, "hidden": 256.0,
        "max_row_rms": 0.3, "weight_absmax": 1.0}
NAMES = {"op": "rmsnorm", "variant": "native-dtype", "dtype": "float16"}
# In-thread servers share the GIL with the test: event-loop lag there is the test's own work, not overload.
RELAXED = SidecarConfig(max_lag_s=60.0)


def _sk(x: float) -> dict[str, float]:
    a = 2 ** (x / 10.0)
    return dict(BASE, absmax=a, rms=a / 3, max_row_rms=a / 3)


def _drift(stream: str) -> list[dict]:
    """200 calls, one each 0.5 s of the producer's clock (from t = 100 s), drifting from |x| = 1 to past the fault."""
    return [{"stream": stream, **NAMES, "sketch": _sk(i * 0.5), "params": {}, "t": 100.0 + i * 0.5} for i in range(200)]


def _post(http: HTTP, body: object) -> list[dict]:
    code, data = http.request("POST", "/v1/observe", json.dumps(body).encode())
    assert code == 200, data
    return json.loads(data)


@pytest.fixture(scope="module")
def server(db):
    with SidecarThread(db, config=RELAXED) as sc:
        yield sc


@pytest.mark.parametrize("lack", ["absent", "null"])
def test_a_record_without_t_is_refused_and_the_forecast_is_undisturbed(server, lack):
    http = HTTP(server.url)
    ref = _drift(f"ref-{lack}")
    del ref[30]
    ref = [dict(a, stream=f"gap-{lack}") for a in _post(http, ref)]  # the same drift without call 30
    first = next(i for i, a in enumerate(ref) if a["warn"])
    assert 30 < first < 150, first  # a forecast warning, after call 30 and well before the fault: one to disturb
    recs = _drift(f"gap-{lack}")
    if lack == "absent":
        del recs[30]["t"]
    else:
        recs[30]["t"] = None
    out = _post(http, recs)
    # Before: the record was stamped with the server's clock, a second producer to the forecaster, and the first
    # warning came dozens of calls later.
    assert out[30] == {"error": "record field 't' is missing: send the producer's time in seconds "
                                "(time.monotonic())"}
    assert out[:30] + out[31:] == ref  # every other answer as if the refused record had never been sent ...
    # ... because it changed nothing: the stream's history holds 199 calls
    assert server.state.streams[(f"gap-{lack}", *NAMES.values())].n_observed == 199


@pytest.mark.parametrize("variant,dtype", [("naive", "float17"), ("fancy", "float16")], ids=["dtype", "variant"])
def test_an_unknown_variant_or_dtype_is_named_before_the_sketch_is_read(server, m, variant, dtype):
    with pytest.raises(CatalogError) as e:  # what the matcher says of the same call, the one wording for both
        m.assess("softmax", variant, dtype, sketch={})
    bad = {"stream": "d", "op": "softmax", "variant": variant, "dtype": dtype, "sketch": {}, "t": 1.0}
    ok = {"stream": "ok", **NAMES, "sketch": _sk(0.0), "t": 1.0}
    out = _post(HTTP(server.url), [bad, ok])
    # Before: "softmax: sketch is missing features numel, rows, ...", the sketch checked before the names.
    assert out[0] == {"error": str(e.value)}
    assert out[1]["stream"] == "ok" and "error" not in out[1]
    assert not any(k[0] == "d" for k in server.state.streams)
