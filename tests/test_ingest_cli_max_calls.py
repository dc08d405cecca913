"""`optwin capture --max-calls N`: the capture's bound on recorded calls, from the command line.

    python -m pytest -q tests/test_ingest_cli_max_calls.py

capture() took max_calls (its memory bound on long runs) but `optwin capture` had no flag for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from optwin.errors import OptwinError
from optwin.ingest.cli import capture_command

app = typer.Typer()
app.command("capture")(capture_command)
app.command("noop")(lambda: None)  # two commands: typer keeps "capture" as a subcommand name

TINY = "optwin.ingest.models:load_llama_tiny"


def _texts(tmp_path: Path) -> Path:
    texts = tmp_path / "texts.txt"
    texts.write_text("The committee approved the budget after a long debate.\n\n"
                     "Rain is expected across the northern valleys tomorrow morning.\n")
    return texts


def test_max_calls_bounds_the_recorded_calls(tmp_path: Path) -> None:
    out = tmp_path / "prof"
    r = CliRunner().invoke(app, ["capture", "--model", TINY, "--out", str(out), "--texts", str(_texts(tmp_path)),
                                 "--max-calls", "5"])
    assert r.exit_code == 0, r.output
    # the same run records 26 calls without the bound (test_ingest_cli): 5 kept, the other 21 skipped
    assert "5 calls" in r.output and "21 skipped" in r.output, r.output


@pytest.mark.parametrize("value", ["0", "-3"])
def test_max_calls_below_one_is_a_one_line_error(tmp_path: Path, value: str) -> None:
    r = CliRunner().invoke(app, ["capture", "--model", "no.such.module:factory", "--out", str(tmp_path / "o"),
                                 "--max-calls", value])
    # refused before the model loads (the factory named here would fail to load)
    assert isinstance(r.exception, OptwinError), r.output
    assert str(r.exception) == f"--max-calls must be a whole number >= 1, got {value}"
