"""`optwin dashboard` refuses an address or port it cannot listen on in one `error:` line, before Streamlit starts.

    python -m pytest -x -q tests/test_dashboard_cli_listen.py

Streamlit used to find out itself, seconds into its start: a 52-line traceback (an address of no interface here,
a host that does not resolve) or its own log line (a busy --port), exit code 1. The check is the sidecar's
(`optwin serve` says the same words).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from test_dashboard_fixture import make_db

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_db(tmp_path_factory.mktemp("dash") / "fp.duckdb", n_builds=1, n_cases=8)


@pytest.mark.parametrize("address,port,reason", [
    ("10.255.255.1", None, "Cannot assign requested address"),  # no interface here has it
    ("notahost.invalid", None, ""),  # .invalid never resolves (RFC 2606); the resolver's words vary
    ("127.0.0.1", "busy", "Address already in use"),  # a port this test holds
])
def test_an_address_it_cannot_listen_on_is_one_line(db: Path, address: str, port: str | None, reason: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        n = held.getsockname()[1] if port == "busy" else 18504
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        # a timeout, not a hang, if the check is gone and Streamlit starts serving instead
        r = subprocess.run([sys.executable, "-m", "optwin.cli", "dashboard", "--db", str(db), "--address", address,
                            "--port", str(n)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    # exactly one line: Streamlit never started (it would have logged, or raised, first)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot listen on tcp://{address}:{n}: ") \
        and lines[0].endswith(reason), r.stderr[-2000:]
