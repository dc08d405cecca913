"""The dashboard in a real headless Chromium, served by the `optwin dashboard` command on localhost.

    python -m pytest -x -q tests/test_dashboard_browser.py      (needs: apt-get install -y chromium)

Runs `python -m optwin.dashboard.cli --db DB --port P` (the same `dashboard_command` the `optwin`
console script registers), waits for Streamlit's health endpoint, then dumps the rendered DOM with
Chromium. Streamlit renders over its websocket after the page loads, so a dump can catch the empty
shell: we retry (bounded) until the page text appears. A screenshot is kept under tests/artifacts/.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from test_dashboard_fixture import direct, make_db

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ATTEMPTS = 10  # a loaded 2-core machine can take several dumps before the app has rendered


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chromium(url: str, *extra: str, budget_ms: int = 30000) -> subprocess.CompletedProcess:
    assert CHROMIUM, "chromium is not installed: apt-get update && apt-get install -y chromium"
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", *extra, url],
            capture_output=True, text=True, timeout=120)


def _text(dom: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom)))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    db = make_db(tmp_path_factory.mktemp("browser") / "fp.duckdb")
    port = _free_port()
    log = open(tmp_path_factory.mktemp("log") / "dashboard.log", "w+")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # own session: the command starts streamlit as its child, and we stop the whole group we started
    proc = subprocess.Popen([sys.executable, "-m", "optwin.dashboard.cli", "--db", str(db), "--port", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"dashboard did not come up (rc {proc.poll()}):\n{log.read()[-2000:]}")
            time.sleep(0.5)
        yield url, db
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _render(url: str, want: str) -> str:
    """The page's text once `want` is in it (bounded retries: the first dumps may be the shell)."""
    text = ""
    for _ in range(ATTEMPTS):
        text = _text(_chromium(url, "--dump-dom").stdout)
        if want in text:
            return text
        time.sleep(1)
    pytest.fail(f"{want!r} never rendered at {url} in {ATTEMPTS} tries; last text: {text[:800]}")


def test_overview_renders_in_chromium(served) -> None:
    url, db = served
    text = _render(url + "/", "Operators covered")
    cases = direct(db, "SELECT count(*) FROM cases WHERE build_id = 'build-2'")[0][0]
    assert "Overview" in text and "Fault totals" in text and "build-2" in text
    assert re.search(rf"Cases\s+{cases}\b", text), text[:1500]
    for page in ("Operator explorer", "Cases", "Live", "Compare builds"):
        assert page in text  # the navigation lists every page

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "dashboard_overview.png"
    for _ in range(ATTEMPTS):  # the shell screenshot is small and blank; the rendered page is not
        shot.unlink(missing_ok=True)
        _chromium(url + "/", f"--screenshot={shot}", "--window-size=1400,1000")
        if shot.exists() and shot.stat().st_size > 40_000:
            break
    assert shot.exists() and shot.stat().st_size > 40_000, "no rendered screenshot"


def test_operator_explorer_renders_in_chromium(served) -> None:
    url, _ = served
    text = _render(url + "/Operator_explorer", "Fault probability over two features")
    assert "P(fault), matcher" in text and "P(fault), replays" in text  # both probabilities, labelled apart
    assert "Boundary" in text and "Variants of rmsnorm compared" in text


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* has them) that listen on `port`."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, _, p = local.partition(":")
                if state == "0A" and int(p, 16) == port:
                    out.add(addr)
    return out


def test_the_dashboard_listens_on_loopback_only_by_default(served):
    # it has no login: like the sidecar, it stays off the network unless told otherwise (--address)
    url, _ = served
    port = int(url.rsplit(":", 1)[1])
    assert _listening(port) == {"0100007F"}  # 127.0.0.1

