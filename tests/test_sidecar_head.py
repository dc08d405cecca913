"""The sidecar's request-head parser refuses the field lines RFC 9112 says to reject, with 400 and a close, so no
byte after them is read as a next request (request smuggling).

    python -m pytest -q tests/test_sidecar_head.py
"""

from __future__ import annotations

import json
import socket

import pytest

from _matcher_fixture import RMS_SKETCH as SK, cached_db
from optwin.fingerprints.sidecar import SidecarConfig, SidecarThread

CFG = SidecarConfig(max_lag_s=60.0, request_timeout_s=2.0)  # the server shares the GIL with the test
DATA = json.dumps([{"stream": "h", "op": "rmsnorm", "variant": "native-dtype", "dtype": "float16", "sketch": SK,
                    "t": 0.0}]).encode()
NEXT = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"  # pipelined: must never be answered after a 400


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = cached_db(str(tmp_path_factory.mktemp("fp") / "fp.duckdb"))
    with SidecarThread(db, config=CFG) as sc:
        yield sc


def exchange(sc: SidecarThread, raw: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each answer to raw, framed by their Content-Length, read until the server closes."""
    with socket.create_connection((sc.sidecar.address.host, sc.sidecar.address.port), timeout=5.0) as s:
        s.sendall(raw)
        out = b""
        while piece := s.recv(1 << 16):
            out += piece
    replies = []
    while out:
        head, _, rest = out.partition(b"\r\n\r\n")
        n = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")))
        replies.append((int(head.split(b" ")[1]), rest[:n]))
        out = rest[n:]
    return replies


N = len(DATA)
REFUSED = [
    # int() reads each of these Content-Length values as a length
    pytest.param(b"Content-Length: +%d\r\n\r\n%s" % (N, DATA), "Content-Length", id="cl-plus"),
    pytest.param(b"Content-Length: %s\r\n\r\n%s" % ("_".join(str(N)).encode(), DATA), "Content-Length",
                 id="cl-underscores"),
    # "1_0" is 10 bytes to int(): "[]" and 8 spaces, then the pipelined GET was served as a second request
    pytest.param(b"Content-Length: 1_0\r\n\r\n[]        ", "Content-Length", id="cl-1_0-smuggle"),
    # whitespace between the field name and the colon (RFC 9112 5.1: MUST reject with 400)
    pytest.param(b"Content-Length : %d\r\n\r\n%s" % (N, DATA), "malformed header line", id="cl-space-colon"),
    pytest.param(b"Transfer-Encoding : chunked\r\n\r\n%s" % chunked(DATA), "malformed header line",
                 id="te-space-colon"),
    # obs-fold: a line starting with SP/HTAB continues the previous field (RFC 9112 5.2); read as its own field
    # before, so a proxy that unfolds it and this server framed the body differently
    pytest.param(b"X-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n%s" % chunked(DATA), "obsolete line folding",
                 id="obs-fold-sp"),
    pytest.param(b"X-A: 1\r\n\tContent-Length: %d\r\n\r\n%s" % (N, DATA), "obsolete line folding",
                 id="obs-fold-tab"),
    pytest.param(b"X-A 1\r\nContent-Length: %d\r\n\r\n%s" % (N, DATA), "malformed header line", id="no-colon"),
    pytest.param(b"X-A: 1\nTransfer-Encoding: chunked\r\n\r\n%s" % chunked(DATA), "CR, LF or NUL", id="bare-lf"),
]


@pytest.mark.parametrize("fields, words", REFUSED)
def test_a_lenient_framing_header_is_refused_and_closed(server, fields, words):
    replies = exchange(server, b"POST /v1/observe HTTP/1.1\r\nHost: x\r\n" + fields + NEXT)
    assert [r[0] for r in replies] == [400], replies
    assert words in json.loads(replies[0][1])["error"]


def test_optional_whitespace_around_values_is_still_read(server):
    """Spaces and tabs around a value are OWS (RFC 9110 5.6.3): still one keep-alive exchange, then the next."""
    replies = exchange(server, b"POST /v1/observe HTTP/1.1\r\nHost: x\r\nContent-Length: \t%d \t\r\n\r\n%s" % (N, DATA)
                       + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert [r[0] for r in replies] == [200, 200]
    assert json.loads(replies[0][1])[0]["stream"] == "h"
