"""Polling the sidecar's warnings (`GET {sidecar}/v1/warnings?since=SEQ`) for the Live page.

    python -c "from optwin.dashboard.live import fetch_warnings; print(fetch_warnings('http://127.0.0.1:8787', 0))"

Pure functions, no Streamlit: the page keeps the cursor and the accumulated warnings in session
state. A warning is one JSON object as the sidecar raises it (an observe answer with its sequence
number and time, optwin/fingerprints/sidecar.py `_warn`): {"seq", "stream", "op", "variant", "dtype",
"probability": {fault: p}, "eta_s", "t", "reason": "risk"|"forecast", "known", ...}; unknown extra keys are kept, missing ones tolerated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd


@dataclass
class Poll:
    """The outcome of one poll: new warnings, or why there are none."""

    warnings: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None  # one line: unreachable, HTTP status, not JSON


def fetch_warnings(url: str, since: int, timeout_s: float = 2.0) -> Poll:
    """Warnings raised after sequence number `since` (oldest first), or an error line."""
    import httpx

    try:
        r = httpx.get(f"{url.rstrip('/')}/v1/warnings", params={"since": since}, timeout=timeout_s)
    except httpx.HTTPError as e:
        return Poll(error=f"the sidecar at {url} is unreachable ({type(e).__name__}): start it with `optwin serve --db DB`")
    if r.status_code != 200:
        return Poll(error=f"the sidecar at {url} answered HTTP {r.status_code}: {r.text.strip()[:200]}")
    try:
        body = r.json()
    except ValueError:
        return Poll(error=f"the sidecar at {url} did not answer JSON")
    if isinstance(body, dict) and isinstance(body.get("warnings"), list):  # tolerate a wrapped list
        body = body["warnings"]
    if not isinstance(body, list):
        return Poll(error=f"the sidecar at {url} answered {type(body).__name__}, expected a JSON list")
    return Poll(warnings=[w for w in body if isinstance(w, dict)])


def merge(seen: list[dict[str, Any]], new: list[dict[str, Any]], cursor: int) -> tuple[list[dict[str, Any]], int]:
    """Append new warnings (deduplicated by seq, whether `since` is inclusive or not); new cursor."""
    have = {w.get("seq") for w in seen if w.get("seq") is not None}
    out = list(seen)
    for w in new:
        seq = w.get("seq")
        if seq is None:
            seq = cursor + 1
            w = {**w, "seq": seq}
        if seq in have:
            continue
        have.add(seq)
        out.append(w)
        cursor = max(cursor, int(seq))
    return out, cursor


def risk(w: dict[str, Any]) -> tuple[float, str | None]:
    """(max fault probability, the fault type that reaches it) of one warning."""
    p = w.get("probability")
    if isinstance(p, dict) and p:
        ft, v = max(((k, float(v)) for k, v in p.items() if isinstance(v, (int, float))), key=lambda kv: kv[1],
                    default=(None, float("nan")))
        return v, ft
    if isinstance(p, (int, float)):
        return float(p), None
    return float("nan"), None


def table(warnings: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per warning: seq, t, stream, op/variant/dtype, risk, fault type, eta_s."""
    rows = []
    for i, w in enumerate(warnings):
        r, ft = risk(w)
        t = w.get("t")
        eta = w.get("eta_s")
        rows.append({
            "seq": w.get("seq"), "t": float(t) if isinstance(t, (int, float)) else float(i),
            "stream": str(w.get("stream", "?")), "op": w.get("op"), "variant": w.get("variant"), "dtype": w.get("dtype"),
            "risk": r, "fault_type": ft,
            "eta_s": float(eta) if isinstance(eta, (int, float)) and math.isfinite(eta) else None,
            "known": w.get("known"), "reason": w.get("reason"),
        })
    cols = ["seq", "t", "stream", "op", "variant", "dtype", "risk", "fault_type", "eta_s", "known", "reason"]
    return pd.DataFrame(rows, columns=cols)
