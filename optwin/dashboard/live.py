"""Polling the sidecar's warnings (`GET {sidecar}/v1/warnings?since=SEQ`) for the Live page.

    python -c "from optwin.dashboard.live import fetch_warnings; print(fetch_warnings('http://127.0.0.1:8787', 0))"

The sidecar is addressed as `optwin serve` listens (http://HOST:PORT or tcp://HOST:PORT, unix:///path.sock)
through optwin's own client, with its bearer token when it has one; https:// (a proxy in front) goes through httpx.

No Streamlit: the page keeps a `Feed` (the accumulated warnings, the cursor, restart detection) in
session state. A warning is one JSON object as the sidecar raises it (an observe answer with its sequence
number and time, optwin/fingerprints/sidecar.py `_warn`): {"seq", "stream", "op", "variant", "dtype",
"probability": {fault: p}, "eta_s", "t", "reason": "risk"|"forecast", "known", ...}; unknown extra keys are kept, missing ones tolerated.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd


@dataclass
class Poll:
    """The outcome of one poll: new warnings, or why there are none."""

    warnings: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None  # one line: unreachable, HTTP status, not JSON



def check_url(url: str) -> str | None:
    """None for a sidecar address the Live page can poll, else one line saying what is expected."""
    if url.startswith(("tcp://", "unix://")):
        from optwin.errors import OptwinError
        from optwin.fingerprints.sidecar import parse_listen

        try:
            parse_listen(url)
        except OptwinError as e:
            return str(e)
        return None
    if url.startswith(("http://", "https://")) and len(url.split("://", 1)[1]) > 0:
        return None
    return (f"sidecar address {url!r}: expected http://HOST:PORT (as `optwin serve` prints it), tcp://HOST:PORT or "
            "unix:///path.sock, or https://... behind a proxy")


def _direct(url: str) -> str | None:
    """The client.HTTP address (tcp://HOST:PORT, unix:///path) of a sidecar URL served directly, or None for a
    URL only a general HTTP client reaches (https, a proxy's path prefix)."""
    if url.startswith(("tcp://", "unix://")):
        return url
    if url.startswith("http://"):
        rest = url[len("http://"):].rstrip("/")
        if "/" not in rest and rest.rpartition(":")[2].isdigit():
            return "tcp://" + rest
    return None


def _get(url: str, path: str, token: str | None, timeout_s: float) -> tuple[int, bytes]:
    """GET `path` from the sidecar: optwin's own client (the sidecar's tcp and unix addresses, its bearer token),
    or httpx for https and prefixed URLs. OSError / httpx.HTTPError when unreachable."""
    direct = _direct(url)
    if direct is not None:
        from optwin.fingerprints.client import HTTP

        http = HTTP(direct, token=token, timeout=timeout_s)
        try:
            return http.request("GET", path)
        finally:
            http.close()
    import httpx

    r = httpx.get(f"{url.rstrip('/')}{path}", timeout=timeout_s,
                  headers={"Authorization": f"Bearer {token}"} if token else None)
    return r.status_code, r.content


def fetch_warnings(url: str, since: int, token: str | None = None, timeout_s: float = 2.0) -> Poll:
    """Warnings raised after sequence number `since` (oldest first), or an error line. `token`: the sidecar's
    --token, sent as a bearer token (a sidecar on a non-loopback address always has one)."""
    import http.client

    import httpx

    try:
        code, data = _get(url, f"/v1/warnings?since={int(since)}", token, timeout_s)
    except (OSError, http.client.HTTPException, httpx.HTTPError) as e:
        return Poll(error=f"the sidecar at {url} is unreachable ({type(e).__name__}): start it with `optwin serve --db DB`")
    if code == 401:
        how = "the token given was refused" if token else "it needs its --token"
        return Poll(error=f"the sidecar at {url} answered HTTP 401 ({how}): start the dashboard with --sidecar-token "
                          "or OPTWIN_SIDECAR_TOKEN, or enter the token above")
    if code != 200:
        return Poll(error=f"the sidecar at {url} answered HTTP {code}: {data.decode('utf-8', 'replace').strip()[:200]}")
    try:
        body = json.loads(data)
    except ValueError:
        return Poll(error=f"the sidecar at {url} did not answer JSON")
    if isinstance(body, dict) and isinstance(body.get("warnings"), list):  # tolerate a wrapped list
        body = body["warnings"]
    if not isinstance(body, list):
        return Poll(error=f"the sidecar at {url} answered {type(body).__name__}, expected a JSON list")
    return Poll(warnings=[w for w in body if isinstance(w, dict)])


@dataclass
class Feed:
    """What the page has seen of one sidecar: the warnings of each of its runs, and the cursor of the current run.

    A sidecar numbers warnings from 1 each time it starts, so after a restart a cursor from the previous run
    asks for numbers the new run has not reached (or reached with other warnings), and de-dup by seq alone
    would drop them. Each poll therefore asks again for the newest warning already seen (`since` = cursor - 1):
    a sidecar still in the same run serves it unchanged (every warning carries the sidecar's wall-clock
    `time`, so a restarted run replaying the same stream does not serve an equal one); one that serves
    nothing numbered that high, or something else under that number, has restarted. Then the cursor starts
    over and the earlier warnings stay, marked with their run number.
    """

    warnings: list[dict[str, Any]] = field(default_factory=list)  # as served, plus "run"
    cursor: int = 0  # highest seq seen in the current run
    run: int = 1
    anchor: dict[str, Any] | None = None  # the current run's warning numbered `cursor`, exactly as served
    restarts: int = 0

    def since(self) -> int:
        return self.cursor - 1 if self.anchor is not None else self.cursor

    def restarted(self, got: list[dict[str, Any]]) -> bool:
        """Whether the warnings served for `since()` come from a later run of the sidecar."""
        if self.anchor is None:  # nothing seen yet, or served without seq: nothing to recognise
            return False
        same = [w for w in got if _seq(w) == self.cursor]
        if same:
            return same[0] != self.anchor
        # the newest warning seen is gone: evicted (warnings_kept) only if newer ones took its place
        return not any((_seq(w) or 0) > self.cursor for w in got)

    def new_run(self) -> None:
        self.run += 1
        self.restarts += 1
        self.cursor, self.anchor = 0, None

    def add(self, got: list[dict[str, Any]]) -> None:
        """Append the current run's warnings not seen yet (de-dup by seq, whether `since` is inclusive or not)."""
        have = {w["seq"] for w in self.warnings if w["run"] == self.run}
        for w in got:
            seq = _seq(w)
            if seq is None:
                seq = self.cursor + 1
            if seq in have:
                continue
            have.add(seq)
            self.warnings.append({**w, "seq": seq, "run": self.run})
            self.cursor = max(self.cursor, seq)
        served = next((w for w in got if _seq(w) == self.cursor), None)
        if served is not None:
            self.anchor = served
        elif self.anchor is not None and _seq(self.anchor) != self.cursor:  # moved on by warnings without seq
            self.anchor = None

    def poll(self, fetch: Callable[[int], Poll]) -> Poll:
        """One poll through `fetch(since)`; after a restart, the new run from its first warning."""
        got = fetch(self.since())
        if got.error is None and self.restarted(got.warnings):
            self.new_run()
            got = fetch(0)
        if got.error is None:
            self.add(got.warnings)
        return got


def _seq(w: dict[str, Any]) -> int | None:
    s = w.get("seq")
    return s if isinstance(s, int) and not isinstance(s, bool) else None


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
    """One row per warning: the sidecar run it came from (1, 2 after a restart, ...), seq, t, stream, op/variant/dtype, risk, fault type, eta_s."""
    rows = []
    for i, w in enumerate(warnings):
        r, ft = risk(w)
        t = w.get("t")
        eta = w.get("eta_s")
        rows.append({
            "run": w.get("run", 1), "seq": w.get("seq"), "t": float(t) if isinstance(t, (int, float)) else float(i),
            "stream": str(w.get("stream", "?")), "op": w.get("op"), "variant": w.get("variant"), "dtype": w.get("dtype"),
            "risk": r, "fault_type": ft,
            "eta_s": float(eta) if isinstance(eta, (int, float)) and math.isfinite(eta) else None,
            "known": w.get("known"), "reason": w.get("reason"),
        })
    cols = ["run", "seq", "t", "stream", "op", "variant", "dtype", "risk", "fault_type", "eta_s", "known", "reason"]
    return pd.DataFrame(rows, columns=cols)


def latest_per_stream(df: pd.DataFrame) -> pd.DataFrame:
    """Each stream's newest warning (by run, then seq) as a whole row. Not groupby().last(): that takes each
    column's last non-null value, so a newest warning without a forecast (eta_s None) would show an older
    warning's eta next to its own risk and reason, a row no warning ever had."""
    out = df.sort_values(["run", "seq"], kind="stable").drop_duplicates("stream", keep="last")
    return out.sort_values("stream", kind="stable").reset_index(drop=True)
