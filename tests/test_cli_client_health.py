"""SidecarClient.health() answers, never raises: the client's docstring promises that nothing raises into the
caller's thread, and its own example is `print(c.health())`.

    python -m pytest -q tests/test_cli_client_health.py

With no sidecar at the address health() raised ConnectionRefusedError (a multi-line traceback in that example);
it now returns {"code": None, "status": "unreachable", "error": one line}. Servers here are real loopback ones.
"""

from __future__ import annotations

import http.server
import socket
import threading
from pathlib import Path

from optwin.fingerprints.client import SidecarClient
from optwin.fingerprints.sidecar import SidecarConfig, SidecarThread
from test_dashboard_fixture import make_db


def _free_port() -> int:
    # bound then closed: nothing listens there, so a connect is refused
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_sidecar_is_an_answer_not_an_exception(tmp_path: Path) -> None:
    for url, reason in ((f"tcp://127.0.0.1:{_free_port()}", "Connection refused"),
                        (f"unix://{tmp_path}/none.sock", "No such file or directory")):
        c = SidecarClient(url)
        try:
            h = c.health()
        finally:
            c.close()
        assert h == {"code": None, "status": "unreachable", "error": f"cannot reach {url}: {reason}"}, h


class _NotOptwin(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b"<html>some other service</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_another_server_on_the_port_is_an_answer_too() -> None:
    srv = http.server.HTTPServer(("127.0.0.1", 0), _NotOptwin)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"tcp://127.0.0.1:{srv.server_address[1]}"
    c = SidecarClient(url)
    try:
        assert c.health() == {"code": 200, "status": "error", "error": f"{url} answered /healthz with no JSON object"}
    finally:
        c.close()
        srv.shutdown()
        srv.server_close()


def test_a_ready_sidecar_answers_ok(tmp_path: Path) -> None:
    db = str(make_db(tmp_path / "fp.duckdb", n_builds=1, n_cases=8))
    with SidecarThread(db, config=SidecarConfig(max_lag_s=60.0)) as sc:
        c = SidecarClient(sc.url)
        try:
            h = c.health()
        finally:
            c.close()
    assert h["code"] == 200 and h["status"] == "ok" and h["build_id"], h
