"""Integers too long for Python's int() or too large for a double cost only their own record, never the batch.

    python -m pytest -q tests/test_sidecar_bigint.py
"""

from __future__ import annotations

import json

from _matcher_fixture import RMS_SKETCH as SK, cached_db
from optwin.fingerprints.client import HTTP
from optwin.fingerprints.sidecar import SidecarConfig, SidecarThread



def rec(stream: str, t: str = "0.0", **extra: str) -> str:
    """One record's JSON text, t and any extra fields spliced in as raw JSON numbers."""
    fields = "".join(f', "{k}": {v}' for k, v in extra.items())
    return (f'{{"stream": "{stream}", "op": "rmsnorm", "variant": "native-dtype", "dtype": "float16", '
            f'"sketch": {json.dumps(SK)}, "t": {t}{fields}}}')


def test_huge_integers_fail_only_their_record(tmp_path):
    db = cached_db(str(tmp_path / "fp.duckdb"))
    body = "[" + ",".join([
        rec("ok"),
        rec("extra5000", extra="9" * 5000),  # past int()'s 4300-digit limit: json.loads failed the whole body
        rec("t400", t="9" * 400),  # an int, but past double range: float(t) raised "int too large to convert"
        rec("t5000", t="-" + "9" * 5000),
        rec("after"),
    ]) + "]"
    with SidecarThread(db, config=SidecarConfig(max_lag_s=60.0)) as sc:
        code, data = HTTP(sc.url).request("POST", "/v1/observe", body.encode())
    assert code == 200, data
    out = json.loads(data)
    assert [o.get("stream") for o in out] == ["ok", "extra5000", None, None, "after"]  # extra fields are ignored
    for o in out[2:4]:
        assert o == {"error": "record field 't' must be a finite number of seconds"}
