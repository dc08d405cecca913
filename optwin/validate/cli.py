"""`optwin validate`: score the fingerprint database against real device runs.

    optwin validate --db fingerprints.duckdb --device cuda --json report.json      # both sides at once
    optwin validate --collect-only gpu.json --device cuda                          # GPU machine: torch only
    optwin validate --labels gpu.json --db fingerprints.duckdb --json report.json  # CPU machine: scoring

Only typer is imported at module import; the collect path loads torch and the optwin modules it
needs (never duckdb/polars/scipy), the scoring path loads the matcher.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import typer

from optwin.errors import CatalogError, OptwinError


def _write_json(obj: Any, path: Path) -> None:
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, allow_nan=False, default=str)
    os.replace(tmp, path)


def _collect(device: str, cases: int, seed: int, ops: list[str] | None, no_triton: bool, trace_calls: int,
             max_seconds: float | None = None, checkpoint: Path | None = None) -> dict[str, Any]:
    import torch

    from optwin.catalog import operator
    from optwin.validate.collect import collect

    for op in ops or []:
        operator(op)  # one-line CatalogError for a typo before any work
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise OptwinError(f"device {device!r} is not available here (torch.cuda.is_available() is False); "
                          "use --device cpu to test the code path")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, ValueError) as e:
        raise OptwinError(f"unusable device {device!r}: {str(e).splitlines()[0]}") from None
    return collect(device, cases, seed, ops, False if no_triton else None, traces=trace_calls > 0,
                   trace_calls=max(trace_calls, 1), progress=lambda m: typer.echo(m, err=True),
                   max_seconds=max_seconds, checkpoint=checkpoint)


def _data_ops(data: dict[str, Any]) -> list[str]:
    """The operators a collection holds cases or traces of, in catalog order."""
    from optwin.catalog import CATALOG

    held = {c.get("op") for c in data.get("cases", [])} | {t.get("op") for t in data.get("traces", [])}
    return [op for op in CATALOG if op in held]


def _only_ops(data: dict[str, Any], ops: list[str], path: Path) -> dict[str, Any]:
    """The collection restricted to `ops`: its cases, traces and failures of other operators left out. Without
    this, --ops with --labels scored everything in the file, and operators the database lacks came in at AUROC 0.5
    and dragged the pooled recall down. An asked operator the file holds nothing of is refused: scoring the rest
    would report on less than was asked for."""
    from optwin.catalog import operator

    for op in ops:
        operator(op)  # one-line CatalogError for a typo
    held = _data_ops(data)
    missing = [op for op in ops if op not in held]
    if missing:
        raise CatalogError(f"--ops {', '.join(missing)}: {path} holds no case or trace of it (it holds "
                           f"{', '.join(held) or 'nothing'})")
    keep = set(ops)
    traces = [t for t in data.get("traces", []) if t.get("op") in keep]
    trace_op = {t.get("name"): t.get("op") for t in data.get("traces", [])}

    def failure_op(f: dict[str, Any]) -> Any:
        if "op" in f:
            return f["op"]
        # A trace's failure names the trace only; one that failed before any call has no record, and trace
        # names start with their operator ("rmsnorm-activations").
        name = str(f.get("trace", ""))
        return trace_op.get(name, name.split("-")[0])

    return {**data, "ops": list(ops), "cases": [c for c in data.get("cases", []) if c.get("op") in keep],
            "traces": traces, "failures": [f for f in data.get("failures", []) if failure_op(f) in keep]}


def _score(data: dict[str, Any], db: Path, threshold: float | None, forecast: str) -> dict[str, Any]:
    from optwin.fingerprints.forecast import ForecastConfig
    from optwin.fingerprints.matcher import Matcher, MatcherConfig
    from optwin.validate.score import score_collection

    config = MatcherConfig() if threshold is None else MatcherConfig(threshold=threshold)
    matcher = Matcher.open(db, config=config)
    return score_collection(data, matcher, forecast=ForecastConfig.preset(forecast))


def validate_command(
    db: Optional[Path] = typer.Option(None, "--db", help="fingerprint database to score (not needed with --collect-only)"),
    device: str = typer.Option("cuda", "--device", help="device the variants run on: cuda, cuda:N, cpu (cpu only tests the code path)"),
    cases: int = typer.Option(200, "--cases", min=1, help="held-out cases per (op, dtype)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the report (or, with --collect-only, nothing else) as JSON here"),
    collect_only: Optional[Path] = typer.Option(None, "--collect-only", help="GPU side only: write sketches, labels and traces to FILE"),
    labels: Optional[Path] = typer.Option(None, "--labels", help="CPU side only: score a FILE written by --collect-only"),
    seed: int = typer.Option(0, "--seed", help="held-out seed (offset by 10**6 from build seeds)"),
    ops: Optional[list[str]] = typer.Option(None, "--ops", help="restrict to these operators: space- or comma-separated, or --ops repeated; default: all"),
    no_triton: bool = typer.Option(False, "--no-triton", help="skip our Triton kernels even where triton imports"),
    trace_calls: int = typer.Option(200, "--trace-calls", min=0, help="calls per drift trace (0: no traces)"),
    threshold: Optional[float] = typer.Option(None, "--threshold", min=0.0, max=1.0, help="matcher warn threshold (default: the matcher's)"),
    forecast: str = typer.Option("default", "--forecast", help="stream forecast preset: default, eager, steady"),
    max_seconds: Optional[float] = typer.Option(None, "--max-seconds", min=1.0, help="time budget of the device side: (op, dtype) groups not started by then are skipped"),
) -> None:
    """Score the fingerprint database against real device runs: AUROC, warn recall/precision, Brier, drift lead times."""
    if collect_only is not None and labels is not None:
        raise CatalogError("--collect-only and --labels are the two halves of one run: give one of them")
    if collect_only is None and db is None:
        raise CatalogError("--db is required to score (only --collect-only runs without it)")
    from optwin.fingerprints.cli import split_values

    op_list = split_values(ops)
    if op_list is not None and not op_list:
        raise CatalogError("--ops names no operator: name some, or leave --ops out for all")
    if forecast not in ("default", "eager", "steady"):
        raise CatalogError(f"unknown forecast preset {forecast!r}; expected one of default, eager, steady")
    if db is not None and collect_only is None:
        from optwin.fingerprints.store import open_store

        open_store(str(db), read_only=True).close()  # missing, foreign or stale: refused before the device run
    for out in (json_out, collect_only):  # an unwritable output would lose the whole run at its end
        if out is not None and not os.access(Path(out).resolve().parent, os.W_OK):
            raise CatalogError(f"cannot write {out}: its directory is missing or not writable")

    if labels is not None:
        from optwin.validate.score import read_collected

        data = read_collected(labels)
        if op_list:
            data = _only_ops(data, list(op_list), labels)
    else:
        data = _collect(device, cases, seed, list(op_list) if op_list else None, no_triton, trace_calls, max_seconds, collect_only)
        if collect_only is not None:
            from optwin.validate.collect import write_collected

            write_collected(data, collect_only)
            typer.echo(f"wrote {collect_only}: {len(data['cases'])} cases, {len(data['traces'])} traces, "
                       f"{len(data['failures'])} failures; score it with "
                       f"`optwin validate --labels {collect_only} --db DB`", err=True)
            return
    assert db is not None
    report = _score(data, db, threshold, forecast)
    report["ops"] = _data_ops(data)  # what the numbers are over: the pooled summary is only comparable for the same ops
    from optwin.validate.score import render

    render(report)
    typer.echo(f"scored ops: {', '.join(report['ops']) or 'none'}", err=True)
    if json_out is not None:
        _write_json(report, json_out)
        typer.echo(f"wrote {json_out}", err=True)
