"""A sidecar monitor stopped and started again still sends (stop() closes its client).

    python -m pytest -q tests/test_monitor_restart.py

stop() closed the sidecar client for good, so after start() again every record was dropped
silently (5 sent, 5 dropped). start() now reopens it: a new queue, connection and sender thread.
Real sidecar (SidecarThread on the fixture database) on loopback TCP and on a unix socket.
"""

from __future__ import annotations

import torch
from torch import nn

import optwin.monitor as om
from optwin.fingerprints.client import SidecarClient
from optwin.fingerprints.sidecar import SidecarConfig, SidecarThread
from optwin.ingest.sketch import sketch


def test_a_restarted_sidecar_monitor_still_sends(db):
    ln = nn.LayerNorm(64).half()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2)).half()  # (4, 64)
    with SidecarThread(db, config=SidecarConfig(max_lag_s=60.0)) as sc:
        mon = om.monitor(ln, sidecar=sc.url, sampling="always")
        for rnd in range(3):
            mon.start()
            with torch.no_grad():
                for _ in range(5):
                    ln(x)
            mon.stop()
            assert mon.client.closed  # stop() still releases the sender thread and the connection
            assert (mon.client.stats.sent, mon.client.stats.dropped) == (5 * (rnd + 1), 0)
        assert sc.state.metrics.records_ok == 15


def test_client_reopen_after_close_on_a_unix_socket(db, tmp_path):
    sock = tmp_path / "s.sock"
    with SidecarThread(db, listen=f"unix://{sock}", config=SidecarConfig(max_lag_s=60.0)) as sc:
        answers: list[dict] = []
        c = SidecarClient(sc.url, on_answer=answers.append)
        sk = sketch("softmax", {"x": torch.randn(4, 32, generator=torch.Generator().manual_seed(3)).half()})
        rec = dict(stream="s", op="softmax", variant="naive", dtype="float16", sketch=sk)
        assert c.observe(**rec)
        c.close()
        assert not c.observe(**rec) and c.stats.dropped == 1  # closed: dropped and counted
        old = c._thread
        c.reopen()
        assert not old.is_alive() and c._thread is not old
        assert c.observe(**rec) and c.flush()
        c.close()
    assert c.stats.sent == 2 and c.stats.errors == 0 and len(answers) == 2
