"""The Live page reaches a sidecar that needs its --token, or listens on a unix socket (the real sidecar).

    python -m pytest -x -q tests/test_dashboard_live_token.py

The token reaches the page through OPTWIN_SIDECAR_TOKEN (`optwin dashboard --sidecar-token` sets it for its
Streamlit child), never through a command line, which every local user can read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from test_dashboard_fixture import make_db
from test_dashboard_live_restart import HOT
from test_dashboard_pages import app, metrics

TOKEN = "s3cr3t-token"


def _raise(sc, n: int, token: str | None = None) -> None:
    from optwin.fingerprints.client import HTTP

    recs = [{"stream": f"s{i}", "op": "rmsnorm", "variant": "native-dtype", "dtype": "float16", "sketch": HOT, "t": 1.0}
            for i in range(n)]
    code, body = HTTP(sc.url, token=token).request("POST", "/v1/observe", json.dumps(recs).encode())
    assert code == 200 and all(a["warn"] for a in json.loads(body))


@pytest.fixture(scope="module")
def fp(tmp_path_factory: pytest.TempPathFactory) -> str:
    from _matcher_fixture import cached_db

    return cached_db(str(tmp_path_factory.mktemp("token") / "fp.duckdb"))


def test_live_sends_the_sidecar_token(fp: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from optwin.fingerprints.sidecar import SidecarThread

    with SidecarThread(fp, listen="tcp://127.0.0.1:0", token=TOKEN) as sc:
        _raise(sc, 3, TOKEN)
        url = "http://" + sc.url[len("tcp://"):]
        at = app(None, "pages/4_Live.py", sidecar=url)  # no token: refused, and the page says how to give one
        assert any("HTTP 401" in i.value and "OPTWIN_SIDECAR_TOKEN" in i.value for i in at.info)
        assert metrics(at)["Warnings"] == "0"
        monkeypatch.setenv("OPTWIN_SIDECAR_TOKEN", TOKEN)
        at = app(None, "pages/4_Live.py", sidecar=url)
        assert metrics(at) == {"Warnings": "3", "Streams": "3", "Last seq": "3"}
        at.text_input(key="live_token").set_value("wrong").run()  # the field overrides the environment
        assert any("HTTP 401" in i.value and "refused" in i.value for i in at.info)


def test_live_reaches_a_unix_socket_sidecar(fp: str) -> None:
    from optwin.fingerprints.sidecar import SidecarThread

    with tempfile.TemporaryDirectory(dir="/tmp") as d:  # a socket path must stay under ~100 bytes
        with SidecarThread(fp, listen=f"unix://{d}/sc.sock") as sc:
            _raise(sc, 2)
            at = app(None, "pages/4_Live.py", sidecar=f"unix://{d}/sc.sock")
            assert metrics(at) == {"Warnings": "2", "Streams": "2", "Last seq": "2"}
    at.text_input(key="live_url").set_value("ftp://example").run()
    assert not at.exception and "expected http://HOST:PORT" in at.error[0].value


def test_cli_accepts_unix_sidecar_and_keeps_the_token_off_the_command_line(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """--sidecar unix://... and --sidecar-token are accepted; the token goes to Streamlit in its environment.
    (`serve` is replaced to capture what would run; test_dashboard_cli_signals.py runs the real one.)"""
    import typer
    from typer.testing import CliRunner

    from optwin.dashboard import cli

    db = make_db(tmp_path / "fp.duckdb", n_builds=1, n_cases=10)
    ran: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(cli, "serve", lambda argv, env=None: ran.append((argv, env)) or 0)
    app_ = typer.Typer()
    app_.command()(cli.dashboard_command)
    r = CliRunner().invoke(app_, ["--db", str(db), "--sidecar", "unix:///run/optwin.sock", "--sidecar-token", TOKEN])
    assert r.exit_code == 0, r.output
    argv, env = ran[0]
    assert argv[argv.index("--sidecar") + 1] == "unix:///run/optwin.sock" and not any(TOKEN in a for a in argv)
    assert env["OPTWIN_SIDECAR_TOKEN"] == TOKEN
    # a bad address: one line, exit 2, before anything starts
    p = subprocess.run([sys.executable, "-m", "optwin.dashboard.cli", "--db", str(db), "--sidecar", "ftp://x"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error: --sidecar:") and p.stderr.count("\n") == 1, p.stderr
