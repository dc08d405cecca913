"""Sidecar request bodies in the chunked transfer coding (RFC 9112 7.1), over real loopback sockets: how
http.client and urllib send a generator body, and what HTTP/1.1 servers must accept (they got 411 before).

    python -m pytest -q tests/test_sidecar_chunked.py
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.request

import pytest

from _matcher_fixture import RMS_SKETCH as SK, cached_db
from optwin.fingerprints.sidecar import SidecarConfig, SidecarThread

# 64 KiB bodies at most, so an oversized body is cheap to send; the lag limit is lifted as in the other sidecar
# tests (the server shares the GIL with the test); 2 s per request, for the stall test
CFG = SidecarConfig(max_lag_s=60.0, max_body=64 << 10, max_discard=4 << 20, request_timeout_s=2.0)


def body_of(*streams: str) -> bytes:
    return json.dumps([{"stream": s, "op": "rmsnorm", "variant": "native-dtype", "dtype": "float16", "sketch": SK,
                        "params": {}, "t": 0.0} for s in streams]).encode()


def chunked(data: bytes, cuts: list[int], ext: bytes = b"", trailers: bytes = b"") -> bytes:
    """data in the chunked coding, cut at these offsets; `ext` after every size, `trailers` (CRLF-ended fields)."""
    out, at = b"", 0
    for end in [*cuts, len(data)]:
        out += b"%x%s\r\n%s\r\n" % (end - at, ext, data[at:end])
        at = end
    return out + b"0%s\r\n%s\r\n" % (ext, trailers)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = cached_db(str(tmp_path_factory.mktemp("fp") / "fp.duckdb"))
    with SidecarThread(db, config=CFG) as sc:
        yield sc


def connect(sc: SidecarThread, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection((sc.sidecar.address.host, sc.sidecar.address.port), timeout=timeout)


def read_all(s: socket.socket) -> bytes:
    out = b""
    while piece := s.recv(1 << 16):
        out += piece
    return out


def split_replies(raw: bytes) -> list[tuple[int, bytes, bytes]]:
    """(status, head, body) of each answer in raw, framed by their Content-Length."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        n = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")))
        out.append((int(head.split(b" ")[1]), head, rest[:n]))
        raw = rest[n:]
    return out


def test_a_chunked_body_cut_inside_json_tokens_with_extensions_and_trailers_then_keep_alive(server):
    """Three requests on one connection, sent in one write: chunked (cut inside "rmsnorm", twice inside a number,
    leaving a one-byte chunk, and before the closing bracket; with chunk extensions and two trailer fields), then a
    Content-Length one, then chunked again: each is answered, so each body ended exactly where it should."""
    data = body_of("c1", "c2")
    cuts = [data.index(b"rmsnorm") + 3, data.index(b"256.0") + 2, data.index(b"256.0") + 3, len(data) - 1]
    first = (b"POST /v1/observe HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
             + chunked(data, cuts, ext=b';name=value;flag ;q="quoted"', trailers=b"X-Sum: 1\r\nX-Other: two\r\n"))
    second = b"POST /v1/observe HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body_of("c3")),
                                                                                     body_of("c3"))
    third = (b"POST /v1/observe HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\nConnection: close\r\n\r\n"
             + chunked(body_of("c4"), [1, 2]))
    with connect(server) as s:
        s.sendall(first + second + third)
        replies = split_replies(read_all(s))
    assert [r[0] for r in replies] == [200, 200, 200], replies
    assert [[x["stream"] for x in json.loads(r[2])] for r in replies] == [["c1", "c2"], ["c3"], ["c4"]]
    assert all(x["known"] and "error" not in x for r in replies for x in json.loads(r[2]))
    assert b"Connection: close" not in replies[0][1] and b"Connection: close" in replies[2][1]


def test_an_oversized_chunked_body_is_answered_413_and_drained(server):
    """Its size is known only while it arrives: past max_body it is refused with 413 like a Content-Length body,
    and the rest is read and dropped (up to max_discard) so that the client reads the answer, not a reset."""
    big = chunked(b"[" + b" " * (1 << 20) + b"]", list(range(1, 1 << 20, 16 << 10)))  # 1 MiB in 16 KiB chunks
    with connect(server) as s:
        s.sendall(b"POST /v1/observe HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + big)
        replies = split_replies(read_all(s))
    assert [(r[0], json.loads(r[2])) for r in replies] == [(413, {"error": "body too large"})]
    assert b"Connection: close" in replies[0][1]


@pytest.mark.parametrize("body,code,words", [
    (b"zz\r\n", 400, "malformed chunk size line 'zz"),
    (b"0x10\r\n", 400, "malformed chunk size line"),
    (b"+10\r\n", 400, "malformed chunk size line"),
    (b" 10\r\n", 400, "malformed chunk size line"),
    (b"-1\r\n", 400, "malformed chunk size line"),
    (b"10\n" + b"x" * 16 + b"\r\n0\r\n\r\n", 400, "malformed chunk size line"),  # a bare LF is no line end
    (b"1" * 17 + b"\r\n", 400, "malformed chunk size line"),  # beyond 2**64
    (b"2;" + b"e" * 5000 + b"\r\nab\r\n0\r\n\r\n", 400, "chunk size line longer than 4096 bytes"),
    (b"2\r\nabc\r\n0\r\n\r\n", 400, "chunk data longer than its chunk size"),
    (b"0\r\n" + b"X-T: " + b"v" * 60000 + b"\r\n" + b"X-U: " + b"v" * 60000 + b"\r\n\r\n", 431, "trailer section"),
])
def test_a_malformed_chunked_body_is_refused_in_one_json_line_and_closed(server, body, code, words):
    with connect(server) as s:
        s.sendall(b"POST /v1/observe HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
        replies = split_replies(read_all(s))
    assert len(replies) == 1 and replies[0][0] == code, replies
    assert b"\n" not in replies[0][2] and words in json.loads(replies[0][2])["error"]
    assert b"Connection: close" in replies[0][1]


@pytest.mark.parametrize("te,version,code,words", [
    (b"gzip", b"HTTP/1.1", 400, "chunked must be the final coding"),
    (b"chunked, gzip", b"HTTP/1.1", 400, "chunked must be the final coding"),
    (b"chunked, chunked", b"HTTP/1.1", 400, "chunked must be the final coding"),
    (b"gzip, chunked", b"HTTP/1.1", 501, "not implemented"),
    (b"gzip\r\nTransfer-Encoding: chunked", b"HTTP/1.1", 501, "not implemented"),  # one list over two lines
    (b"chunked", b"HTTP/1.0", 400, "Transfer-Encoding needs HTTP/1.1"),
])
def test_transfer_codings_other_than_chunked_are_refused(server, te, version, code, words):
    with connect(server) as s:
        s.sendall(b"POST /v1/observe %s\r\nTransfer-Encoding: %s\r\n\r\n1\r\n[\r\n" % (version, te))
        replies = split_replies(read_all(s))
    assert len(replies) == 1 and replies[0][0] == code and words in json.loads(replies[0][2])["error"], replies


def test_content_length_and_chunked_together_are_read_as_chunked_and_closed(server):
    """Transfer-Encoding wins (RFC 9112 6.3); the connection closes after the answer, so the bytes a Content-Length
    reader would have taken for a second request (a smuggling attempt) are never served."""
    data = body_of("both")
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(server) as s:
        s.sendall(b"POST /v1/observe HTTP/1.1\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(data)
                  + chunked(data, [10]) + smuggled)
        replies = split_replies(read_all(s))
    assert [r[0] for r in replies] == [200] and json.loads(replies[0][2])[0]["stream"] == "both"
    assert b"Connection: close" in replies[0][1]


def test_a_stalled_chunked_body_is_closed_after_the_request_timeout(server):
    """One deadline for the whole body: chunks trickled in (here: one, then silence) do not extend it."""
    with connect(server, timeout=10.0) as s:
        t0 = time.monotonic()
        s.sendall(b"POST /v1/observe HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n[{\"st")
        assert read_all(s) == b""  # closed, without an answer
        assert 1.5 < time.monotonic() - t0 < 8.0


def test_http_client_and_urllib_generator_bodies(server):
    """Both send an iterable body without a length as chunked: the stdlib's own way to stream a request."""
    data = body_of("gen1")
    host, port = server.sidecar.address.host, server.sidecar.address.port
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("POST", "/v1/observe", body=(data[i:i + 7] for i in range(0, len(data), 7)))
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())[0]["stream"] == "gen1"
        conn.request("POST", "/v1/observe", body=body_of("gen2"))  # the same connection, kept alive
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())[0]["stream"] == "gen2"
    finally:
        conn.close()
    req = urllib.request.Request(f"http://{host}:{port}/v1/observe", data=iter([data[:20], data[20:]]),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200 and json.loads(r.read())[0]["stream"] == "gen1"


def test_a_chunked_body_without_the_token_is_refused_and_dropped(tmp_path):
    """401 before the body is read, as for a Content-Length body; the chunked body still sent is read to its end
    and dropped, so the client reads the answer and the connection then closes."""
    db = cached_db(str(tmp_path / "fp.duckdb"))
    with SidecarThread(db, token="s3cret", config=CFG) as sc:
        with connect(sc) as s:
            s.sendall(b"POST /v1/observe HTTP/1.1\r\nAuthorization: Bearer nope\r\nTransfer-Encoding: chunked\r\n\r\n"
                      + chunked(b" " * (1 << 20), [1 << 18, 1 << 19]))
            replies = split_replies(read_all(s))
    assert [r[0] for r in replies] == [401] and b"Connection: close" in replies[0][1]


@pytest.mark.parametrize("lengths", [(b"2", b"%d"), (b"%d, 2",)])
def test_different_content_lengths_are_refused_and_closed(server, lengths):
    """Two Content-Length values (two fields, or one list): the last one was taken, so a proxy in front that took
    the first framed another body than this server read. RFC 9112 6.3: 400 and close; nothing after is served."""
    data = body_of("cl")
    fields = b"".join(b"Content-Length: %s\r\n" % (v % len(data) if b"%d" in v else v) for v in lengths)
    with connect(server) as s:
        s.sendall(b"POST /v1/observe HTTP/1.1\r\nHost: x\r\n%s\r\n%s" % (fields, data)
                  + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        replies = split_replies(read_all(s))
    assert [r[0] for r in replies] == [400] and "conflicting Content-Length" in json.loads(replies[0][2])["error"]


def test_the_same_content_length_repeated_is_folded(server):
    data = body_of("same")
    with connect(server) as s:
        s.sendall(b"POST /v1/observe HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nContent-Length: %d, %d\r\n"
                  b"Connection: close\r\n\r\n%s" % (len(data), len(data), len(data), data))
        replies = split_replies(read_all(s))
    assert [r[0] for r in replies] == [200] and json.loads(replies[0][2])[0]["stream"] == "same"
