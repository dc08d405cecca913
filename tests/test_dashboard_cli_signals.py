"""Stopping `optwin dashboard` stops its Streamlit server (a real `python -m optwin.dashboard.cli` on loopback).

    python -m pytest -x -q tests/test_dashboard_cli_signals.py

The command serves Streamlit as a child process. SIGTERM (systemd, `docker stop`, `kill`) used to end the
command alone and leave the child, re-parented to init, serving the port.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from test_dashboard_browser import ROOT, _free_port
from test_dashboard_fixture import make_db
from _procs import alive


def _healthy(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1).status == 200
    except OSError:
        return False


def _start(db: Path, tmp_path: Path) -> tuple[subprocess.Popen, int, int]:
    """The command, its Streamlit child's pid, and the port, once the server answers."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # own session: whatever happens, the finally of the test can stop the whole group it started
    proc = subprocess.Popen([sys.executable, "-m", "optwin.dashboard.cli", "--db", str(db), "--port", str(port)],
                            cwd=ROOT, env=env, stdout=open(tmp_path / "log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while not _healthy(port):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()[-2000:]
        time.sleep(0.2)
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
        (child,) = [int(p) for p in f.read().split()]
    return proc, child, port


def _gone(pid: int, port: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not alive(pid) and not _healthy(port):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_command_stops_streamlit(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM is forwarded and waited for (the command exits 0 after its server); even SIGKILL, which nothing
    can forward, takes the server down with the command (Linux parent-death signal)."""
    db = make_db(tmp_path / "fp.duckdb", n_builds=1, n_cases=10)
    proc, child, port = _start(db, tmp_path)
    try:
        os.kill(proc.pid, sig)
        code = proc.wait(timeout=15)
        assert _gone(child, port, within_s=10), f"streamlit (pid {child}) still serves port {port} after {sig.name}"
        if sig == signal.SIGTERM:
            assert code == 0, (tmp_path / "log").read_text()[-2000:]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if alive(child):
            os.kill(child, signal.SIGKILL)
