"""A monitor whose sidecar is unreachable, refuses its token or rejects a record says so, once, and counts it.

    python -m pytest -q tests/test_s49_sidecar_client_failures.py

`optwin.monitor(model, sidecar=URL)` pointed at a closed port, or at a `--token` sidecar without the token,
lost every record with no log line at INFO or above (outages went to log.debug, HTTP 401 answers and the
sidecar's per-record errors were only counted) and `mon.stats` had no field for it. The client's sender thread
now logs a WARNING on 'optwin.client' with the URL and the reason, the first of each kind at once and then at
most once per `warn_every_s` with a count, and MonitorStats carries the sidecar_* counts. Sidecars here are
real loopback ones (SidecarThread on the fixture database); the unreachable one is a port nothing listens on.
"""

from __future__ import annotations

import logging
import socket
import time

import pytest
import torch
from torch import nn

import optwin.monitor as om
from _matcher_fixture import RMS_SKETCH
from optwin.fingerprints.client import SidecarClient
from optwin.fingerprints.sidecar import SidecarConfig, SidecarThread


def _free_port() -> int:
    # bound then closed: nothing listens there, so a connect is refused
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "optwin.client" and r.levelno >= logging.WARNING]


def _run(mon: om.Monitor, calls: int) -> None:
    """`calls` float16 LayerNorm calls under the monitor, then stop (which flushes the client)."""
    ln = mon.model
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(49)).half()  # (4, 64)
    with mon, torch.no_grad():
        for _ in range(calls):
            ln(x)


def test_unreachable_sidecar_warns_once_with_url_and_reason(caplog):
    url = f"tcp://127.0.0.1:{_free_port()}"
    caplog.set_level(logging.WARNING, logger="optwin.client")
    mon = om.monitor(nn.LayerNorm(64).half(), sidecar=url, sampling="always")
    _run(mon, 20)
    lines = _client_lines(caplog)
    # several failed batches (the client retries with backoff), one line: not one per call or per batch
    assert len(lines) == 1, lines
    assert url in lines[0] and "unreachable (Connection refused)" in lines[0], lines
    st = mon.stats
    assert (st.sidecar_failed, st.sidecar_sent, st.sidecar_dropped) == (20, 0, 0), st
    assert mon.client.stats.reconnects >= 2  # it did fail more than once


def test_an_outage_that_goes_on_is_told_again_with_a_count(caplog):
    url = f"tcp://127.0.0.1:{_free_port()}"
    caplog.set_level(logging.WARNING, logger="optwin.client")
    c = SidecarClient(url, warn_every_s=0.3)
    try:
        end = time.monotonic() + 1.6  # backoff 0.05 .. 0.8 s: 5 failed batches, spread over > 0.3 s
        while time.monotonic() < end:
            c.observe("s", "rmsnorm", "native-dtype", "float16", RMS_SKETCH)
            time.sleep(0.01)
    finally:
        c.close(1.0)
    lines = _client_lines(caplog)
    assert 2 <= len(lines) < c.stats.reconnects, (lines, c.stats)
    assert "so far" in lines[0] and all("since the last report" in line for line in lines[1:]), lines


def test_token_sidecar_without_token_warns_about_the_token(db, caplog):
    caplog.set_level(logging.WARNING, logger="optwin.client")
    with SidecarThread(db, token="s3cret", config=SidecarConfig(max_lag_s=60.0)) as sc:
        mon = om.monitor(nn.LayerNorm(64).half(), sidecar=sc.url, sampling="always")
        _run(mon, 5)
        lines = _client_lines(caplog)
        assert len(lines) == 1, lines
        assert sc.url in lines[0] and "HTTP 401" in lines[0] and "token=" in lines[0], lines
        assert (mon.stats.sidecar_failed, mon.stats.sidecar_sent) == (5, 0), mon.stats

        caplog.clear()  # the same with the token: sent, and nothing to tell
        good = om.monitor(nn.LayerNorm(64).half(), sidecar=sc.url, token="s3cret", sampling="always")
        _run(good, 5)
        assert _client_lines(caplog) == []
        assert (good.stats.sidecar_failed, good.stats.sidecar_sent) == (0, 5), good.stats


def test_a_rejected_record_logs_the_sidecars_error_text_once(db, caplog):
    caplog.set_level(logging.WARNING, logger="optwin.client")
    with SidecarThread(db, config=SidecarConfig(max_lag_s=60.0)) as sc:
        mon = om.monitor(nn.LayerNorm(64).half(), sidecar=sc.url, sampling="always")
        mon.start()
        # records the monitor's own sites never make: an operator the sidecar does not know
        for i in range(3):
            mon.client.observe(f"bad{i}", "nosuchop", "naive", "float16", RMS_SKETCH)
        mon.stop()
        answer = sc.state.observe_record({"stream": "x", "op": "nosuchop", "variant": "naive", "dtype": "float16",
                                          "sketch": RMS_SKETCH, "t": 0.0})
    lines = _client_lines(caplog)
    assert len(lines) == 1, lines
    assert "rejected a record of stream 'bad0'" in lines[0] and answer["error"] in lines[0], (lines, answer)
    assert (mon.stats.sidecar_errors, mon.stats.sidecar_sent) == (3, 3), mon.stats


def test_two_senders_share_the_rate_limit_without_losing_a_thread() -> None:
    """reopen() starts a second sender while the old one still times out against a hung sidecar; both tell
    the same _Reports. Unlocked, both passed the rate check at once and the second pop raised KeyError, which
    killed that sender (every later record dropped). Counts stay exact too."""
    import sys
    import threading

    from optwin.fingerprints.client import _Reports

    reports = _Reports("tcp://127.0.0.1:1", every_s=0.0)
    errors: list[str] = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race shows within a few thousand calls
    logging.disable(logging.CRITICAL)
    try:
        def tell() -> None:
            try:
                for _ in range(20000):
                    reports.tell("unreachable", 1, "unreachable (test)")
            except Exception as e:  # noqa: BLE001 - the failure under test
                errors.append(repr(e))

        threads = [threading.Thread(target=tell) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
        logging.disable(logging.NOTSET)
    assert errors == []
    assert reports._total["unreachable"] == 40000
