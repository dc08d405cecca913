"""`optwin capture` as a plain typer command (registered by optwin/cli.py).

    python -m pytest -q tests/test_ingest_cli.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from optwin.errors import OptwinError
from optwin.ingest import read_profile
from optwin.ingest.cli import capture_command

app = typer.Typer()
app.command("capture")(capture_command)
app.command("noop")(lambda: None)  # two commands: typer keeps "capture" as a subcommand name


def test_capture_writes_a_profile(tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("The committee approved the budget after a long debate.\n\n"
                     "Rain is expected across the northern valleys tomorrow morning.\n")
    out = tmp_path / "prof"
    r = CliRunner().invoke(app, ["capture", "--model", "optwin.ingest.models:load_llama_tiny", "--out", str(out),
                                 "--texts", str(texts), "--sample-rate", "1.0", "--capacity", "1"])
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and "26 calls" in r.output
    p = read_profile(out)
    assert p.meta["n_texts"] == 2 and p.meta["sampling"]["capacity"] == 1 and len(p.index) >= 4
    assert {op for op, _, _ in p.triples()} == {"attention", "matmul", "rmsnorm", "rope"}


@pytest.mark.parametrize("args,match", [
    (["--model", "gpt-17"], "unknown model 'gpt-17'"),
    (["--model", "no.such.module:factory"], "cannot load model factory"),
    (["--model", "os.path:join"], "model factory 'os.path:join' raised TypeError: join() missing"),
    (["--model", "os:sep"], "model factory 'os:sep' is a str, not a function"),
    (["--model", "llama-tiny", "--texts", "/no/such/file.txt"], "no such file"),
])
def test_bad_input_is_a_one_line_optwin_error(tmp_path: Path, args: list[str], match: str) -> None:
    r = CliRunner().invoke(app, ["capture", "--out", str(tmp_path / "o"), *args])
    assert r.exit_code != 0
    assert isinstance(r.exception, OptwinError) and match in str(r.exception) and "\n" not in str(r.exception)


def test_help_lists_options() -> None:
    r = CliRunner().invoke(app, ["capture", "--help"])
    assert r.exit_code == 0 and "--model" in r.output and "--texts" in r.output
