"""`optwin build` and `optwin migrate` (registered by optwin/cli.py; runnable alone for tests).

    python -m optwin.fingerprints.cli build --quick --out fingerprints.duckdb

Imports only typer at import time; the builder, rich, duckdb and torch load inside the commands.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, List, Optional

import typer
from typer.core import TyperCommand

if TYPE_CHECKING:
    from optwin.fingerprints.build import BuildConfig


def spread_values(args: list[str], option: str) -> list[str]:
    """`OPTION a b c` -> `OPTION a OPTION b OPTION c`: the values after `option` up to the next option (a token
    starting with '-') or `--`, each given its own copy of the option. `OPTION=a b` spreads the same way."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        out.append(a)
        i += 1
        if a == "--":  # the end of options: the rest is left as it is
            out += args[i:]
            break
        if a == option and i < len(args):
            out.append(args[i])  # the option's own value, as click takes it
            i += 1
        elif not a.startswith(option + "="):
            continue
        while i < len(args) and not args[i].startswith("-"):
            out += [option, args[i]]
            i += 1
    return out


# Help of the options whose default is the preset's; format_help appends the presets' values.
_PRESET_HELP = {"replays": "Noisy replays per case", "cases": "Cases per (op, dtype, source)"}


def preset_defaults(field: str) -> str:
    """`quick 192, full 384`: `field` of each build preset, read from build.PRESETS so the help cannot drift
    from what a build uses (it did: the help said quick 32 cases while the preset held 192)."""
    from optwin.fingerprints.build import PRESETS

    return ", ".join(f"{p.name} {getattr(p, field)}" for p in PRESETS.values())


def split_values(values: list[str] | None) -> tuple[str, ...] | None:
    """The values of a repeatable option, each of which may be comma-separated: `--ops a,b --ops c` -> (a, b, c).
    None (not given) stays None; given but naming nothing (`--ops ""`, `--ops ,`) is an empty tuple, which the
    commands refuse rather than read as "all"."""
    return tuple(v.strip() for item in values for v in item.split(",") if v.strip()) if values else None


class OpsCommand(TyperCommand):
    """A command reading `--ops a b c` as `--ops a --ops b --ops c` (spec: `[--ops ...]`): build and validate.

    A click option takes a fixed number of values, so `--ops matmul geodesic` left `geodesic` an unexpected extra
    argument. Rewriting the arguments before click parses them keeps --ops one ordinary repeatable option (its
    help, its error messages, the comma form) and is unambiguous: neither command takes positional arguments."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:  # noqa: ANN001 (click's Context)
        return super().parse_args(ctx, spread_values(args, "--ops"))


class BuildCommand(OpsCommand):
    """`optwin build`: OpsCommand, its help's preset defaults filled in when shown."""

    def format_help(self, ctx, formatter) -> None:  # noqa: ANN001 (click's Context and HelpFormatter)
        # Filled in here, not in the typer.Option: build.py imports torch, and every optwin command imports this
        # module, so the presets are read only when the help is shown.
        for param in self.params:
            if param.name in _PRESET_HELP:
                param.help = f"{_PRESET_HELP[param.name]} (default: the preset's: {preset_defaults(param.name)})."
        return super().format_help(ctx, formatter)


def build_command(
    profile: Optional[str] = typer.Option(None, "--profile", help="Input profile (from `optwin capture`); default: the built-in sweep."),
    ops: Optional[List[str]] = typer.Option(None, "--ops", help="Operators to build: space- or comma-separated, or --ops repeated; default: all."),
    replays: Optional[int] = typer.Option(None, "--replays", help=_PRESET_HELP["replays"] + "."),
    out: str = typer.Option("fingerprints.duckdb", "--out", help="Database file (created or extended with a new build)."),
    engine: str = typer.Option("local", "--engine", help="local (process pool) or ray."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (default: a local cluster)."),
    quick: bool = typer.Option(False, "--quick", help="Small build for demos and tests (<= 2 min on 2 cores)."),
    resume: bool = typer.Option(False, "--resume", help="Continue a killed build, keeping its finished shards."),
    seed: int = typer.Option(0, "--seed", help="Seed of every case generator and replay."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Parallel workers (default: CPU cores)."),
    noise: str = typer.Option("stochastic", "--noise", help="Replay noise: stochastic, mca, order or none."),
    cases: Optional[int] = typer.Option(None, "--cases", help=_PRESET_HELP["cases"] + "."),
) -> None:
    """Replay the twins over a profile or the default sweep and write the fault-fingerprint database."""
    from rich.console import Console

    from optwin.fingerprints.build import BuildConfig, build, check_inputs
    from optwin.fingerprints.progress import BuildProgress, print_summary

    op_list = split_values(ops)  # an empty tuple (`--ops ""`) is refused by check_inputs
    cfg = BuildConfig(out=out, profile=profile, ops=op_list, replays=replays, cases=cases, noise=noise, engine=engine,
                      address=address, quick=quick, resume=resume, seed=seed, workers=workers)
    check_inputs(cfg)  # one `error:` line before any progress output (so build() is told not to check again)
    console = Console(stderr=True)
    saved = signal.signal(signal.SIGTERM, _interrupt)  # a scheduler's SIGTERM takes Ctrl-C's path: workers stop too
    try:
        with BuildProgress(console) as progress:
            result = build(cfg, on_start=progress.start, on_shard=progress.advance,
                           on_note=lambda line: console.print(line, soft_wrap=True, highlight=False), checked=True)
    except KeyboardInterrupt:
        console.print(interrupted_message(cfg), soft_wrap=True, highlight=False)
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGTERM, saved)
    stdout = Console()
    if result.already_done:
        typer.echo(f"{cfg.out} already holds build {result.build_id} (it had finished when it was stopped): nothing "
                   f"to resume; removed {cfg.work_dir}")
        return
    print_summary(stdout if stdout.is_terminal else Console(width=160), result)


def interrupted_message(cfg: BuildConfig) -> str:
    """The line printed on Ctrl-C/SIGTERM: true whether or not the build had already been swapped into --out."""
    from optwin.fingerprints.build import landed_build

    bid = landed_build(cfg)
    if bid is not None:
        return (f"interrupted after the build was saved: {cfg.out} holds build {bid}; the same command with --resume "
                f"removes what is left of {cfg.work_dir}")
    return (f"interrupted: {cfg.out} is as it was; finished shards stay in {cfg.work_dir}, and the same command with "
            "--resume continues from them")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def migrate_command(db: str = typer.Argument(..., help="Fingerprint database to upgrade in place.")) -> None:
    """Upgrade a fingerprint database to this optwin's schema version (atomically)."""
    from optwin.fingerprints.store import migrate_database

    # The library says nothing by default; the command shows its progress lines on stderr (stdout keeps the result).
    before, after = migrate_database(db, on_note=lambda line: typer.echo(line, err=True))
    if before == after:
        typer.echo(f"{db}: already at schema version {after}")
    else:
        typer.echo(f"{db}: migrated schema version {before} -> {after}")


def _standalone() -> None:
    """`python -m optwin.fingerprints.cli build ...`: the same commands outside the main CLI."""
    from optwin.cli import run_app

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command("build", cls=BuildCommand)(build_command)
    app.command("migrate")(migrate_command)
    run_app(app)


if __name__ == "__main__":
    _standalone()
