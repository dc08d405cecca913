"""A sidecar on a unix socket removes at shutdown only the socket file it bound, even when the file now at its path
has the same inode number.

    python -m pytest -q tests/test_s48_sidecar_socket_identity.py

The sidecar used to know its socket file by st_ino alone, and checked it after closing its listener and draining
requests in flight. While a unix socket listens (or any connection it accepted is open) its file's inode is held;
once those close and the file is gone, ext4 and xfs hand the same inode number to the next file made, so a sidecar
restarted on the same path in that moment (it removes the old socket nobody answers on) bound a socket with the old
one's number, and the old sidecar's cleanup removed it: the new sidecar ran on without an address.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket

import pytest

from _matcher_fixture import cached_db
from _procs import wait_for
from optwin.fingerprints.client import HTTP
from optwin.fingerprints.sidecar import Sidecar, SidecarConfig, SidecarState, SidecarThread, parse_listen

SK = {"numel": 256.0, "rows": 4.0, "absmax": 3.0, "rms": 1.0, "nonfinite": 0.0, "hidden": 64.0,
      "max_row_rms": 1.2, "weight_absmax": 1.0}
CFG = SidecarConfig(max_lag_s=60.0, request_timeout_s=10.0)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return cached_db(str(tmp_path_factory.mktemp("fp") / "fp.duckdb"))


def reuses_inodes(d) -> bool:
    """Whether this directory's filesystem gives a freed inode number to the next file (ext4: yes, tmpfs: no)."""
    p = str(d / "probe")
    numbers = []
    for _ in range(2):
        with open(p, "w"):
            pass
        numbers.append(os.lstat(p).st_ino)
        os.unlink(p)
    return numbers[0] == numbers[1]


@pytest.mark.parametrize("replacement", ["sidecar", "file"])
def test_shutdown_leaves_a_replacement_that_got_the_old_inode(db, tmp_path, replacement):
    """The old sidecar's listener closes, its file is replaced, then its shutdown runs: what used to happen between
    its listener's close and its check, held open here so that the inode number is reused for certain."""
    path = str(tmp_path / "sc.sock")
    reuse = reuses_inodes(tmp_path)

    async def scenario() -> SidecarThread | None:
        old = Sidecar(SidecarState(db, config=CFG), parse_listen(f"unix://{path}"))
        await old.start()
        ino = os.lstat(path).st_ino
        old._server.close()  # nothing else holds the file's inode: it is freed when the file goes
        await old._server.wait_closed()
        new = None
        if replacement == "sidecar":  # removes the old socket (nobody answers on it) and binds its own
            new = SidecarThread(db, listen=f"unix://{path}", config=CFG).start()
        else:
            os.unlink(path)
            with open(path, "w") as f:
                f.write("someone else's")
        if reuse:  # the collision the old st_ino check fell for
            assert os.lstat(path).st_ino == ino
        await old.aclose()
        return new

    new = asyncio.run(scenario())
    try:
        assert os.path.exists(path), "the old sidecar removed the file that replaced its socket"
        if new is not None:
            assert HTTP(new.url).request("GET", "/healthz")[0] == 200
            new.stop()
            assert not os.path.exists(path)  # its own socket file a sidecar does remove
        else:
            with open(path) as f:
                assert f.read() == "someone else's"
    finally:
        if new is not None and new._thread.is_alive():
            new.stop()


def refused(path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
        return False
    except (ConnectionRefusedError, FileNotFoundError):
        return True


def test_a_restart_during_the_drain_keeps_its_address(db, tmp_path):
    """The real-world order: the old sidecar is stopped with a request in flight, a new one starts on the same path
    while it drains, then the old one answers and exits. The new one keeps its socket file, and the old one, which
    now gives its file up before it stops listening, leaves the address free for it at once."""
    path = str(tmp_path / "sc.sock")
    old = SidecarThread(db, listen=f"unix://{path}", config=CFG).start()
    new = None
    try:
        body = json.dumps([{"stream": "s", "op": "rmsnorm", "variant": "native-dtype", "dtype": "float16",
                            "sketch": SK, "t": 0.0}]).encode()
        busy = socket.socket(socket.AF_UNIX)
        busy.settimeout(10)
        busy.connect(path)  # its head arrives, its body not all: the old sidecar's aclose waits for it
        busy.sendall(b"POST /v1/observe HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:10])
        assert wait_for(lambda: any(old.sidecar._conns.values()), 5.0, step_s=0.01), "the request did not arrive"
        old.sidecar.stop()
        assert wait_for(lambda: refused(path), 5.0, step_s=0.01), "the old sidecar kept its address"
        new = SidecarThread(db, listen=f"unix://{path}", config=CFG).start()
        busy.sendall(body[10:])
        assert busy.recv(1 << 16).startswith(b"HTTP/1.1 200")  # the request in flight is still answered
        busy.close()
        old._thread.join(10)
        assert not old._thread.is_alive()
        assert HTTP(new.url).request("GET", "/healthz")[0] == 200
    finally:  # a stopped sidecar's loop is closed: stop() only what still runs
        for sc in (old, new):
            if sc is not None and sc._thread.is_alive():
                sc.stop()
    assert not os.path.exists(path)
