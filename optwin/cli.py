"""The `optwin` command line.

    optwin --help

Each command's implementation lives next to its subsystem (`optwin/<subpackage>/cli.py`); this module
only registers them. Every `OptwinError`, usage error or OS refusal (a busy port, an unwritable path)
becomes one line `error: ...` and exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer

try:  # typer 0.2x carries its own copy of click; its exceptions are those
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # older typer runs on click itself
    from click.exceptions import NoArgsIsHelpError, UsageError

from optwin.errors import OptwinError

app = typer.Typer(
    name="optwin",
    help="Operator digital twins and fault fingerprints for GPU operators in LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# command name -> (module, function[, command class, as "module:Class" or a name in the module]). The modules import
# only typer at import time. A command class (a typer.core.TyperCommand) is for a command that reads its arguments
# its own way (build and validate: `--ops a b c`).
COMMANDS: dict[str, tuple[str, ...]] = {
    "build": ("optwin.fingerprints.cli", "build_command", "BuildCommand"),
    "migrate": ("optwin.fingerprints.cli", "migrate_command"),
    "capture": ("optwin.ingest.cli", "capture_command"),
    "serve": ("optwin.fingerprints.serve_cli", "serve_command"),
    "dashboard": ("optwin.dashboard.cli", "dashboard_command"),
    "validate": ("optwin.validate.cli", "validate_command", "optwin.fingerprints.cli:OpsCommand"),
    "demo": ("optwin.demo", "demo_command"),
}

def _command_class(module: Any, name: str | None) -> Any:
    if name is None:
        return None
    if ":" in name:
        module_name, name = name.split(":")
        module = importlib.import_module(module_name)
    return getattr(module, name)


for _name, (_module, _func, *_cls) in COMMANDS.items():
    _mod = importlib.import_module(_module)
    app.command(_name, cls=_command_class(_mod, _cls[0] if _cls else None))(getattr(_mod, _func))


def main(argv: list[str] | None = None) -> None:
    run_app(app, argv)


def run_app(typer_app: typer.Typer, argv: list[str] | None = None) -> None:
    """Run one command of `typer_app` and exit. Bad input of any kind (our own checks, click's usage errors, a
    path or address the OS refuses) is one line `error: ...` and exit code 2; Ctrl-C is exit code 130."""
    try:
        rc = typer_app(args=argv, standalone_mode=False)
    except NoArgsIsHelpError as e:  # `optwin` alone, or a group without its command: the help
        typer.echo(e.ctx.get_help() if e.ctx else str(e))
        sys.exit(0)
    except UsageError as e:
        where = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
        _fail(f"{_one_line(e.format_message())}{where}")
    except (OptwinError, OSError) as e:
        _fail(_one_line(str(e)) or type(e).__name__)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("interrupted", err=True)
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) else 0)


def _one_line(msg: str) -> str:
    return " ".join(msg.split())


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    sys.exit(2)


if __name__ == "__main__":
    main()
