"""`optwin capture`: run a PyTorch model under the capture hooks and write an input profile.

    optwin capture --model minilm --out profiles/minilm [--texts FILE]

Registered by optwin/cli.py. Heavy imports (transformers, polars, safetensors) happen inside the
command, not at import time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

# The names load_model accepts, for --model's help (typed by hand, it lacked minilm-eager). The package
# optwin.ingest already loads torch, and models.py adds nothing heavier at import (transformers loads per model).
from optwin.ingest.models import _BUILTIN as _BUILTIN_MODELS

MODEL_HELP = " | ".join([*_BUILTIN_MODELS, "PACKAGE.MODULE:FACTORY"])


def check_out_dir(out: Path) -> None:
    """A --out the profile can be written to: a writable directory, or a path whose nearest existing parent is
    one (write_profile creates the rest). optwin.fingerprints.build.check_out checks a database FILE and refuses
    a directory, which is what a profile is, so the walk is repeated here for a directory."""
    from optwin.errors import OptwinError
    from optwin.writable import check_writable_in

    path = Path(os.path.abspath(out))
    if path.exists() and not path.is_dir():
        raise OptwinError(f"--out {out} exists and is not a directory")
    check_writable_in("--out", out, path)


def capture_command(
    model: Annotated[str, typer.Option(help=MODEL_HELP)],
    out: Annotated[Path, typer.Option(help="profile directory to write")],
    texts: Annotated[Optional[Path], typer.Option(help="text file, one input per line (default: Python's own docstrings)")] = None,
    max_texts: Annotated[int, typer.Option(min=1, help="use at most this many texts")] = 64,
    batch_size: Annotated[int, typer.Option(min=1, help="texts per forward")] = 8,
    sample_rate: Annotated[float, typer.Option(min=0.0, max=1.0, help="probability a call's tensors are offered to the reservoir")] = 0.05,
    capacity: Annotated[int, typer.Option(min=0, help="raw calls kept per (op, variant, dtype, shape class)")] = 4,
    seed: Annotated[int, typer.Option(help="reservoir seed")] = 0,
    max_calls: Annotated[Optional[int], typer.Option(
        help="record only the first N calls, count the rest as skipped (bounds memory on long runs; default: all)",
        metavar="N")] = None,
) -> None:
    """Run a PyTorch model under the capture hooks and write an input profile."""
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from optwin.errors import OptwinError
    from optwin.ingest.capture import capture
    from optwin.ingest.models import ModelError, default_texts, load_model, read_texts
    from optwin.ingest.profile import check_profile_target

    console = Console(stderr=True)
    if max_calls is not None and max_calls < 1:  # capture() raises a ValueError too, but only after the model loads
        raise OptwinError(f"--max-calls must be a whole number >= 1, got {max_calls}")
    check_out_dir(out)  # before the model loads and the capture runs, not after
    check_profile_target(out)  # writing replaces the directory: refuse one holding other files now, not after the capture
    if texts is not None:
        if not texts.is_file():
            raise ModelError(f"--texts {texts}: no such file")
        items = read_texts(texts)[:max_texts]
        if not items:
            raise ModelError(f"--texts {texts}: no non-empty lines")
    else:
        items = default_texts(max_texts)
    with console.status(f"loading {model}"):
        lm = load_model(model)
    batches = list(lm.batches(items, batch_size))
    with torch.no_grad(), capture(lm.module, sample_rate=sample_rate, capacity=capacity, seed=seed,
                                  max_calls=max_calls) as rec:
        with Progress(TextColumn("capture {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as bar:
            task = bar.add_task(lm.name, total=len(batches))
            for i, batch in enumerate(batches):
                try:
                    lm.module(**batch)
                except Exception as e:  # noqa: BLE001 - the user's model: one line here, its traceback when they run it
                    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    raise ModelError(f"model {model!r} raised {type(e).__name__} on batch {i} of {len(batches)}: {first} "
                                     f"(it is called as module(**batch) with {', '.join(batch)})") from None
                bar.advance(task)
    path = rec.write_profile(out, model=lm.name, extra={"texts": str(texts) if texts else "python docstrings",
                                                        "n_texts": len(items), "batch_size": batch_size})
    table = Table(title=f"profile {path}")
    for col in ("op", "variant", "dtype", "calls", "streams"):
        table.add_column(col)
    recs = rec.records()
    keys = sorted({(r["op"], r["variant"], r["dtype"]) for r in recs})
    for k in keys:
        mine = [r for r in recs if (r["op"], r["variant"], r["dtype"]) == k]
        table.add_row(*k, str(len(mine)), str(len({r["stream"] for r in mine})))
    Console().print(table)
    kept = sum(len(b) for b in rec.samples.values())
    typer.echo(f"wrote {path}: {len(recs)} calls, {kept} sampled calls, {sum(rec.skipped.values())} skipped")
