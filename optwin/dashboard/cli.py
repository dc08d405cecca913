"""`optwin dashboard` (registered by optwin/cli.py): the Streamlit dashboard as a subprocess.

    optwin dashboard --db fingerprints.duckdb [--sidecar http://127.0.0.1:8787 | unix:///path.sock] [--port 8501]
    (a sidecar with --token: OPTWIN_SIDECAR_TOKEN=... in the environment, or --sidecar-token)
    (without the console script: python -m streamlit run optwin/dashboard/app.py --server.headless true -- --db DB)

Imports only typer at import time. The database is checked here first, so a missing or foreign file
is one line `error: ...` instead of a page that only says so in the browser.

Streamlit runs as a child process. SIGTERM, SIGINT and SIGHUP sent to this command (systemd, `docker stop`,
`kill`, Ctrl-C) are forwarded to it and the command waits for it to exit, so stopping the command stops the
server; on Linux the child also gets SIGTERM if this process dies without forwarding (SIGKILL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
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


def check_address(address: str, port: int | None) -> None:
    """Refuse in one line (ListenError) an address or port Streamlit could not listen on, before it starts: it
    takes seconds to start, then says so in a traceback or its own log line and exits 1. Without --port only the
    address is checked: Streamlit then moves on from a busy default port by itself."""
    from optwin.fingerprints.sidecar import Address, check_bind, parse_listen

    check_bind(parse_listen(address) if address.startswith("unix://") else Address("tcp", host=address, port=port or 0))


STOP_GRACE_S = 10.0  # after a forwarded signal, Streamlit gets this long to stop before it is killed
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the parent dies, even by SIGKILL (PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def serve(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run `argv` (streamlit) as a child, forward stop signals to it, and return its exit status once it exits.

    subprocess.call returned only on the child's exit and handled only KeyboardInterrupt: a SIGTERM killed this
    process and left Streamlit serving the port, re-parented to init.
    """
    child: list[subprocess.Popen] = []

    def forward(signum: int, frame: object) -> None:
        if child and child[0].poll() is None:
            child[0].send_signal(signum)
            # a server that does not stop is killed, so the command never hangs on the way out
            timer = threading.Timer(STOP_GRACE_S, lambda: child[0].poll() is None and child[0].kill())
            timer.daemon = True
            timer.start()

    # handlers first: a signal between the start and the handlers would otherwise end us with the child running
    old = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        child.append(subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent if sys.platform == "linux" else None))
        code = child[0].wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if child and child[0].poll() is None:  # an exception on the way: never leave the server behind
            child[0].kill()
            child[0].wait()
    return 128 - code if code < 0 else code  # killed by signal N: the shell's 128 + N


def dashboard_command(
    db: str = typer.Option(..., "--db", help="Fingerprint database (from `optwin build`)."),
    sidecar: Optional[str] = typer.Option(
        None, "--sidecar", help="Address of a running `optwin serve` for the Live page: http://HOST:PORT, "
                                "tcp://HOST:PORT or unix:///path.sock (as its --listen)."),
    sidecar_token: Optional[str] = typer.Option(
        None, "--sidecar-token", envvar="OPTWIN_SIDECAR_TOKEN", show_envvar=True,
        help="The sidecar's --token. Prefer the environment variable: a command line is visible to every local user."),
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
    if sidecar:
        from optwin.dashboard.live import check_url

        if (bad := check_url(sidecar)) is not None:
            raise InputError(f"--sidecar: {bad}")
    check_address(address, port)
    env = dict(os.environ)
    if sidecar_token:  # to the child through its environment, not its command line (ps)
        env["OPTWIN_SIDECAR_TOKEN"] = sidecar_token
    raise typer.Exit(serve(streamlit_argv(db, sidecar, port, address), env=env))


def _standalone() -> None:
    """`python -m optwin.dashboard.cli --db DB ...`: the same command outside the main CLI."""
    from optwin.cli import run_app

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(dashboard_command)
    run_app(app)


if __name__ == "__main__":
    _standalone()
