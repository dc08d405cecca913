"""`optwin dashboard` (registered by optwin/cli.py): the Streamlit dashboard as a subprocess.

    optwin dashboard --db fingerprints.duckdb [--sidecar http://127.0.0.1:8787] [--port 8501]
    (without the console script: python -m streamlit run optwin/dashboard/app.py --server.headless true -- --db DB)

Imports only typer at import time. The database is checked here first, so a missing or foreign file
is one line `error: ...` instead of a page that only says so in the browser.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

APP = Path(__file__).with_name("app.py")


def streamlit_argv(db: str, sidecar: str | None = None, port: int | None = None, address: str | None = None) -> list[str]:
    """The `python -m streamlit run` command line that serves the dashboard headless."""
    argv = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
            "--browser.gatherUsageStats", "false"]
    if port is not None:
        argv += ["--server.port", str(port)]
    if address is not None:
        argv += ["--server.address", address]
    argv += ["--", "--db", str(Path(db).resolve())]
    if sidecar:
        argv += ["--sidecar", sidecar]
    return argv


def dashboard_command(
    db: str = typer.Option(..., "--db", help="Fingerprint database (from `optwin build`)."),
    sidecar: Optional[str] = typer.Option(None, "--sidecar", help="URL of a running `optwin serve` for the Live page."),
    port: Optional[int] = typer.Option(None, "--port", help="Port to serve on (default: Streamlit's, 8501)."),
    address: str = typer.Option("127.0.0.1", "--address",
                                help="Address to listen on (default loopback, as the sidecar's; the dashboard has no "
                                     "login, so 0.0.0.0 shows the database to the whole network)."),
) -> None:
    """Serve the Streamlit exploration dashboard of a fingerprint database (headless; open the URL it prints)."""
    from optwin.dashboard.data import open_data
    from optwin.errors import InputError

    open_data(db).close()  # DatabaseError / SchemaVersionError: one line, non-zero exit
    if port is not None and not 0 < port < 65536:
        raise InputError(f"--port must be in 1..65535, got {port}")
    if sidecar and not sidecar.startswith(("http://", "https://")):
        raise InputError(f"--sidecar must be an http(s) URL, got {sidecar!r}")
    try:
        code = subprocess.call(streamlit_argv(db, sidecar, port, address))
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)


def _standalone() -> None:
    """`python -m optwin.dashboard.cli --db DB ...`: the same command outside the main CLI."""
    from optwin.cli import run_app

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(dashboard_command)
    run_app(app)


if __name__ == "__main__":
    _standalone()
