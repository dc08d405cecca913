"""`optwin serve`: the online prediction sidecar (registered by optwin/cli.py; runnable alone).

    python -m optwin.fingerprints.serve_cli --db fingerprints.duckdb --listen tcp://127.0.0.1:8765

Imports only typer at import time; the sidecar (and with it torch and the store) loads inside.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer


def serve_command(
    db: str = typer.Option(..., "--db", help="Fingerprint database (from `optwin build`); reloaded when replaced."),
    listen: str = typer.Option("tcp://127.0.0.1:8765", "--listen",
                               help="tcp://HOST:PORT or unix:///path.sock; non-loopback needs --token."),
    token: Optional[str] = typer.Option(None, "--token", envvar="OPTWIN_SIDECAR_TOKEN",
                                        help="Require `Authorization: Bearer TOKEN` on every request."),
    warnings_jsonl: Optional[str] = typer.Option(None, "--warnings-jsonl", help="Append every warning to this JSONL file."),
    max_records_per_s: Optional[float] = typer.Option(None, "--max-records-per-s",
                                                      help="Answer 503 above this record rate (default: only on overload)."),
    max_streams: int = typer.Option(200_000, "--max-streams",
                                    help="Streams kept (~5 KB each); beyond it the least recently seen is dropped."),
    stream_ttl_s: Optional[float] = typer.Option(None, "--stream-ttl-s",
                                                 help="Drop a stream not seen for this many seconds (default: never)."),
    log_level: str = typer.Option("INFO", "--log-level", help="Logging level of the sidecar."),
) -> None:
    """Serve per-call fault risk and per-stream forecasts over HTTP (POST /v1/observe, GET /v1/warnings, /metrics, /healthz)."""
    import logging

    from optwin.errors import InputError
    from optwin.fingerprints.matcher import _current_build_id
    from optwin.fingerprints.sidecar import SidecarConfig, check_listen, parse_listen, serve
    from optwin.fingerprints.store import open_store

    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        raise InputError(f"--log-level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL; got {log_level!r}")
    if max_records_per_s is not None and not max_records_per_s > 0:
        raise InputError(f"--max-records-per-s must be > 0, got {max_records_per_s}")
    if max_streams < 1:
        raise InputError(f"--max-streams must be >= 1, got {max_streams}")
    if stream_ttl_s is not None and not stream_ttl_s > 0:
        raise InputError(f"--stream-ttl-s must be > 0, got {stream_ttl_s}")
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    # Bad input is one `error:` line and nothing else, so everything the load would trip on is checked before the
    # "loading" notice: the address (form, --token off loopback, what the OS refuses), then the database file
    # (missing, not DuckDB, not ours, another schema version, no build yet: the matcher's own check, so its words);
    # opening it is milliseconds, the full load is not.
    check_listen(parse_listen(listen), token)
    with open_store(db, read_only=True) as store:
        _current_build_id(store)
    if warnings_jsonl:
        try:
            open(warnings_jsonl, "a").close()  # the sidecar appends to it (creating it) anyway
        except OSError as e:
            raise InputError(f"--warnings-jsonl {warnings_jsonl}: {e.strerror or e}") from None
    cfg = SidecarConfig(max_records_per_s=max_records_per_s, max_streams=max_streams, stream_ttl_s=stream_ttl_s)
    typer.echo(f"optwin serve: loading {db}", err=True)
    serve(db, listen=listen, token=token, warnings_jsonl=warnings_jsonl, config=cfg, checked=True)


def _standalone() -> None:
    """`python -m optwin.fingerprints.serve_cli --db DB ...`: the same command outside the main CLI."""
    from optwin.cli import run_app

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(serve_command)
    run_app(app)


if __name__ == "__main__":
    _standalone()
