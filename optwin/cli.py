"""The `optwin` command line.

    optwin --help

Each command's implementation lives next to its subsystem (`optwin/<subpackage>/cli.py`); this module
only registers them. Every `OptwinError` becomes one line `error: ...` and exit code 2, never a
traceback.
"""

from __future__ import annotations

import importlib
import sys

import typer

from optwin.errors import OptwinError

app = typer.Typer(
    name="optwin",
    help="Operator digital twins and fault fingerprints for GPU operators in LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# command name -> (module, function). The modules import only typer at import time.
COMMANDS: dict[str, tuple[str, str]] = {
    "build": ("optwin.fingerprints.cli", "build_command"),
    "migrate": ("optwin.fingerprints.cli", "migrate_command"),
    "capture": ("optwin.ingest.cli", "capture_command"),
    "serve": ("optwin.fingerprints.serve_cli", "serve_command"),
    "dashboard": ("optwin.dashboard.cli", "dashboard_command"),
    "validate": ("optwin.validate.cli", "validate_command"),
    "demo": ("optwin.demo", "demo_command"),
}

for _name, (_module, _func) in COMMANDS.items():
    app.command(_name)(getattr(importlib.import_module(_module), _func))


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, standalone_mode=True)
    except OptwinError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
