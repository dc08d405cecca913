"""kill -9 of a real `optwin serve` process mid-stream: the client keeps running and reconnects.

    python -m pytest -q tests/test_sidecar_crash.py
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from _matcher_fixture import RMS_SKETCH as SK
from optwin.fingerprints.client import HTTP, SidecarClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(db: str, url: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "optwin.fingerprints.serve_cli", "--db", db, "--listen", url,
                          "--log-level", "WARNING"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": ROOT})
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if HTTP(url, timeout=1).request("GET", "/healthz")[0] == 200:
                return p
        except OSError:
            pass
        if p.poll() is not None:
            raise RuntimeError(p.stderr.read().decode())
        time.sleep(0.1)
    p.kill()
    raise RuntimeError("sidecar did not start")


def test_kill_9_mid_stream_client_keeps_running_and_reconnects(db):
    url = f"tcp://127.0.0.1:{_free_port()}"
    server = _start(db, url)
    client = SidecarClient(url, queue_size=2000, batch_size=50, timeout_s=1.0)
    try:
        def send(n: int, start: int) -> float:
            t0 = time.perf_counter()
            for i in range(start, start + n):
                client.observe("crash", "rmsnorm", "native-dtype", "float16", SK, t=i * 0.01)
                time.sleep(0.0005)
            return time.perf_counter() - t0

        send(400, 0)
        assert client.flush(10)
        sent_before = client.stats.sent
        assert sent_before == 400
        os.kill(server.pid, signal.SIGKILL)
        server.wait(10)
        took = send(400, 400)  # the model keeps calling while the sidecar is dead
        assert took < 5.0  # never blocked on the dead server
        server = _start(db, url)  # restarted (by its supervisor, here: us)
        deadline = time.time() + 20
        while client.stats.sent == sent_before and time.time() < deadline:
            client.observe("crash", "rmsnorm", "native-dtype", "float16", SK, t=10.0)
            time.sleep(0.05)
        send(200, 900)
        assert client.flush(20)
        assert client.stats.sent > sent_before + 200  # reconnected and serving again
        assert client.stats.reconnects >= 1
        st = client.stats
        assert st.sent + st.failed + st.dropped + st.rejected == st.queued + st.dropped
    finally:
        client.close(2)
        server.kill()
        server.wait(10)
