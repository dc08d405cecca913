"""The Live page's "Per stream, latest" table shows each stream's newest warning whole.

    python -m pytest -x -q tests/test_dashboard_live_latest.py

A newest warning without a forecast (eta_s None, reason "risk") must not borrow the older warning's
eta_s: groupby().last() takes each column's last non-null value and mixes the two.
"""

from __future__ import annotations

import math

from optwin.dashboard import live


def _w(seq: int, t: float, p_nf: float, eta: float | None, reason: str, stream: str = "layers.3.mlp.norm") -> dict:
    return {"seq": seq, "stream": stream, "op": "rmsnorm", "variant": "native-dtype", "dtype": "float16", "t": t,
            "reason": reason, "probability": {"nonfinite": p_nf, "precision_loss": 0.2}, "eta_s": eta, "known": True}


def test_latest_per_stream_keeps_the_newest_warning_whole() -> None:
    feed = live.Feed()
    feed.add([_w(1, 10.0, 0.1, 4.5, "forecast"), _w(2, 20.0, 0.9, None, "risk"),
              _w(3, 5.0, 0.3, 2.0, "forecast", stream="layers.0.attn")])
    latest = live.latest_per_stream(live.table(feed.warnings)).set_index("stream")
    assert list(latest.index) == ["layers.0.attn", "layers.3.mlp.norm"]
    row = latest.loc["layers.3.mlp.norm"]
    assert (row["seq"], row["t"], row["risk"], row["reason"]) == (2, 20.0, 0.9, "risk")
    assert row["eta_s"] is None or math.isnan(row["eta_s"])  # its own: no forecast, not seq 1's 4.5
    assert latest.loc["layers.0.attn", "eta_s"] == 2.0
