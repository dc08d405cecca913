"""`optwin serve` stops cleanly on SIGTERM and SIGINT: the request in flight is answered, the unix socket file is
removed, one log line says why it stopped, and the exit status is 0.

    python -m pytest -q tests/test_sidecar_signals.py

SIGTERM (what systemd, docker and kubernetes send) used to kill the process at once (status 143, answers in flight
cut, the socket file left behind), and SIGINT left the socket file too.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from _procs import wait_for

ROOT = Path(__file__).resolve().parents[1]
SK = {"numel": 256.0, "rows": 4.0, "absmax": 3.0, "rms": 1.0, "nonfinite": 0.0, "hidden": 64.0,
      "max_row_rms": 1.2, "weight_absmax": 1.0}


def read_until(s: socket.socket, marker: bytes) -> bytes:
    out = b""
    while marker not in out:
        piece = s.recv(1 << 16)
        if not piece:
            break
        out += piece
    return out


def answers(path: str) -> bool:
    """Whether the server answers /healthz on path: the socket file alone is no sign, check_listen binds the path
    for a moment before the database loads (and before the signal handlers are in place)."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(path)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return read_until(s, b"\r\n\r\n").startswith(b"HTTP/1.1 200")
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_stops_cleanly_on_a_signal(db, sig):
    d = tempfile.mkdtemp(prefix="owsig", dir="/tmp")  # a unix socket path must stay under ~100 bytes
    path = os.path.join(d, "s.sock")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "optwin.cli", "serve", "--db", db, "--listen", f"unix://{path}"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: answers(path) or proc.poll() is not None, 60, step_s=0.1), "the server did not start"
        assert proc.poll() is None, proc.stderr.read()
        idle = socket.socket(socket.AF_UNIX)  # a keep-alive connection between requests: closed at once
        idle.connect(path)
        idle.settimeout(10)
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_until(idle, b'"status"').startswith(b"HTTP/1.1 200")
        busy = socket.socket(socket.AF_UNIX)
        busy.connect(path)
        busy.settimeout(10)
        body = json.dumps([{"stream": "s", "op": "rmsnorm", "variant": "native-dtype", "dtype": "float16",
                            "sketch": SK, "t": 0.0}]).encode()
        busy.sendall(b"POST /v1/observe HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
                     % len(body))
        # the 100 Continue says the server has read the head: this request is in flight when the signal comes
        assert read_until(busy, b"\r\n\r\n").startswith(b"HTTP/1.1 100")
        proc.send_signal(sig)
        assert idle.recv(1) == b""  # closed, not answered after the signal
        busy.sendall(body)
        answer = b""
        while piece := busy.recv(1 << 16):  # answered, then closed
            answer += piece
        head, _, data = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head, answer
        assert json.loads(data)[0]["stream"] == "s"
        idle.close()
        busy.close()
        rc = proc.wait(20)
        err = proc.stderr.read()
        assert rc == 0, err
        assert not os.path.exists(path)
        assert err.splitlines()[-1].endswith(f"optwin sidecar stopped on {sig.name}"), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        if os.path.exists(path):
            os.unlink(path)
        os.rmdir(d)
