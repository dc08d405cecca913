"""Rich progress bar (shards, replays, ETA) and the end-of-build summary table.

    optwin build --quick
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table


class BuildProgress:
    """Progress over shards; the replay count and the last finished shard ride along in the text."""

    def __init__(self, console: Console):
        self.progress = Progress(TextColumn("[bold]build[/] {task.fields[what]}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[replays]:,} replays"), TimeElapsedColumn(),
                                 TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False)
        self.task = None
        self.replays = 0

    def __enter__(self) -> "BuildProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def start(self, total: int, done: int) -> None:
        what = f"(resuming: {done} shards done)" if done else ""
        self.task = self.progress.add_task("build", total=total, completed=done, what=what, replays=0)

    def advance(self, summary: dict[str, Any]) -> None:
        self.replays += summary["replays"]
        self.progress.update(self.task, advance=1, replays=self.replays, what=summary["shard"])


def print_summary(console: Console, result: Any) -> None:
    table = Table(title=f"build {result.build_id} -> {result.out}")
    for col in ("op", "variant", "dtype", "cases", "replays", "rejected", "nonfinite", "precision_loss", "low_entropy"):
        table.add_column(col, justify="right" if col not in ("op", "variant", "dtype") else "left")
    for r in result.summary:
        rates = [f"{r['rates'][f]:.3f}" if f in r["rates"] else "-" for f in ("nonfinite", "precision_loss", "low_entropy")]
        table.add_row(r["op"], r["variant"], r["dtype"], str(r["cases"]), f"{r['replays']:,}", str(r["rejected"]), *rates)
    console.print(table)
    console.print(f"{result.cases:,} cases, {result.replays:,} replays, {result.fingerprints:,} fingerprint rows; "
                  f"{result.shards_run} shards run, {result.shards_skipped} resumed; {result.duration_s:.1f} s")
