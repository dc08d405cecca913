"""Sidecar connections that misbehave at the transport level: clients that never read their answers.

    python -m pytest -q tests/test_sidecar_connections.py
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from optwin.fingerprints.client import HTTP
from optwin.fingerprints.sidecar import SidecarConfig, SidecarThread
from _procs import wait_for

REQ = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"  # ~2.5 KB answers
# 2 s: long enough that a slow CI machine fills its sockets (and reads a refused body) before the timeout acts
CFG = SidecarConfig(max_lag_s=60.0, request_timeout_s=2.0)

# The kernel's own tables tell whether the server still holds a connection: its counters cannot show a socket it
# has given up on but not closed.
linux_only = pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads /proc/net (Linux)")


def _tcp_held(port: int, socks: list[socket.socket]) -> int:
    """How many of these clients' connections the server on 127.0.0.1:port holds (server side, ESTABLISHED)."""
    ours = {f"0100007F:{port:04X} 0100007F:{s.getsockname()[1]:04X}" for s in socks}
    with open("/proc/net/tcp") as f:
        return sum(" ".join(ln.split()[1:3]) in ours and ln.split()[3] == "01" for ln in f.readlines()[1:])


def _unix_held(path: str) -> int:
    """Connected sockets of the server at this unix path (its accepted ones carry the path too)."""
    with open("/proc/net/unix") as f:
        return sum(ln.split()[-1] == path and ln.split()[5] == "03" for ln in f.readlines()[1:])


@linux_only
def test_pipelined_requests_whose_answers_are_never_read_are_cut_off(db):
    """The answers back up until the server waits in drain(): it used to wait there for ever, holding the connection
    and ~1 MB of buffer; now for request_timeout_s, then it drops the connection."""
    with SidecarThread(db, config=CFG) as sc:
        addr = (sc.sidecar.address.host, sc.sidecar.address.port)
        socks = []
        for _ in range(3):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(addr)
            s.setblocking(False)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # until the server stops reading requests
                try:
                    s.send(REQ * 1000)
                except BlockingIOError:
                    break
                time.sleep(0)  # let the server thread run
            socks.append(s)
        assert _tcp_held(addr[1], socks) == 3
        assert wait_for(lambda: _tcp_held(addr[1], socks) == 0, 15.0), _tcp_held(addr[1], socks)
        assert sc.state.metrics.connections == 0
        assert HTTP(sc.url).request("GET", "/healthz")[0] == 200
        for s in socks:
            s.close()


@linux_only
def test_a_burst_then_silence_without_reading_is_closed_after_the_timeout(db, tmp_path):
    """A burst whose answers overfill the kernel's buffer by less than the drain threshold, then silence: the idle
    timeout closes the connection, and close() used to wait for ever for the unread answers to be flushed."""
    path = str(tmp_path / "sc.sock")
    with SidecarThread(db, listen=f"unix://{path}", config=CFG) as sc:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(REQ)
            time.sleep(0.2)
            one = len(s.recv(1 << 16))  # one answer's size
        kernel = socket.socket(socket.AF_UNIX).getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)  # what the kernel queues
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(REQ * ((kernel + (512 << 10)) // one))  # ~0.5 MB left in the server's own buffer
            time.sleep(0.2)
            assert _unix_held(path) == 1
            assert wait_for(lambda: _unix_held(path) == 0, 12.0)  # 2 s idle timeout + 2 s to flush, then dropped
            assert sc.state.metrics.connections == 0
        assert HTTP(sc.url).request("GET", "/healthz")[0] == 200


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(1 << 16):
        out += chunk
    return out


def test_a_request_without_the_token_is_refused_before_its_body_is_read(db):
    """401 is written as soon as the head is read: the server no longer buffers up to max_body (8 MB) of an
    unauthenticated body first. A body the client still sends is dropped, and the connection closes."""
    with SidecarThread(db, listen="tcp://127.0.0.1:0", token="s3cret", config=CFG) as sc:
        addr = (sc.sidecar.address.host, sc.sidecar.address.port)
        size = 4 << 20
        with socket.create_connection(addr, timeout=6.0) as s:
            s.sendall(b"POST /v1/observe HTTP/1.1\r\nAuthorization: Bearer nope\r\nContent-Length: %d\r\n\r\n" % size)
            head = s.recv(4096)  # no body sent yet: this answer cannot wait for it
            assert head.startswith(b"HTTP/1.1 401") and b"Connection: close" in head
            s.sendall(b" " * size)  # read and dropped, not reset under the client
            assert _read_all(s).count(b"HTTP/1.1") == 0  # nothing more, then EOF
        # a refused request without a body keeps its connection, as before
        with socket.create_connection(addr, timeout=3.0) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\n\r\nGET /healthz HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n"
                      b"Connection: close\r\n\r\n")
            both = _read_all(s)
            assert both.startswith(b"HTTP/1.1 401") and b"HTTP/1.1 200" in both


def test_expect_100_continue_is_answered_and_a_refusal_does_not_wait_for_the_body(db):
    """curl sends "Expect: 100-continue" for bodies over 1 MB and holds the body back for up to 1 s unless told to
    go on: accepted requests get "100 Continue" at once; refused ones (401, 413) their final answer and a close,
    without the server waiting for a body that is not coming."""
    cfg = SidecarConfig(max_lag_s=60.0, request_timeout_s=10.0, max_body=1 << 20)
    with SidecarThread(db, listen="tcp://127.0.0.1:0", token="s3cret", config=cfg) as sc:
        addr = (sc.sidecar.address.host, sc.sidecar.address.port)
        body = b'{"stream": "e", "op": "rmsnorm", "variant": "native-dtype", "dtype": "float16", "t": 0, "sketch": ' \
               b'{"numel": 256, "rows": 4, "absmax": 3, "rms": 1, "nonfinite": 0, "hidden": 64, "max_row_rms": 1.2, ' \
               b'"weight_absmax": 1}}'
        body += b" " * ((900 << 10) - len(body))
        head = b"POST /v1/observe HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: %d\r\n"
        with socket.create_connection(addr, timeout=3.0) as s:
            s.sendall(head % len(body) + b"Authorization: Bearer s3cret\r\nConnection: close\r\n\r\n")
            assert s.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
            s.sendall(body)
            reply = _read_all(s)
            assert reply.startswith(b"HTTP/1.1 200") and b'"stream":"e"' in reply
        for length, auth, code in ((len(body), b"nope", b"401"), (2 << 20, b"s3cret", b"413"), (2 << 20, b"nope", b"413")):
            with socket.create_connection(addr, timeout=3.0) as s:
                t0 = time.monotonic()
                s.sendall(head % length + b"Authorization: Bearer " + auth + b"\r\n\r\n")
                reply = _read_all(s)  # the final answer, then EOF: no 100, and no wait for the body
                assert reply.startswith(b"HTTP/1.1 " + code) and b"100 Continue" not in reply
                assert time.monotonic() - t0 < 2.0
        # without Expect nothing changes: no interim answer
        with socket.create_connection(addr, timeout=3.0) as s:
            s.sendall(b"POST /v1/observe HTTP/1.1\r\nContent-Length: %d\r\nAuthorization: Bearer s3cret\r\n"
                      b"Connection: close\r\n\r\n" % len(body) + body)
            assert _read_all(s).startswith(b"HTTP/1.1 200")
