"""`optwin capture` refuses a model it cannot run and an --out it cannot write with one line, the latter
before loading the model.

    python -m pytest -q tests/test_ingest_cli_errors.py
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


def _one_line_error(r, match: str) -> None:
    assert r.exit_code != 0
    assert isinstance(r.exception, OptwinError), r.exception
    assert match in str(r.exception) and "\n" not in str(r.exception), str(r.exception)


def test_a_plain_module_that_cannot_take_the_batch_is_a_one_line_error(tmp_path: Path) -> None:
    # torch.nn.Identity(): a factory returning a plain nn.Module whose forward takes no input_ids
    r = CliRunner().invoke(app, ["capture", "--model", "torch.nn:Identity", "--out", str(tmp_path / "p"), "--max-texts", "2"])
    _one_line_error(r, "model 'torch.nn:Identity' raised TypeError on batch 0 of 1: ")
    assert "input_ids" in str(r.exception)
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("where,match", [
    ("file/sub", "file is not a directory"),  # a path under a regular file
    ("file", "exists and is not a directory"),
    ("/proc/optwin-nowhere/prof", "cannot write in /proc"),  # unwritable even for root
])
def test_bad_out_is_refused_before_the_model_loads(tmp_path: Path, where: str, match: str) -> None:
    (tmp_path / "file").write_text("x")
    out = where if where.startswith("/") else str(tmp_path / where)
    # The model spec cannot load either: the --out error proves the check runs first.
    r = CliRunner().invoke(app, ["capture", "--model", "no.such.module:factory", "--out", out])
    _one_line_error(r, match)


def test_an_existing_writable_directory_is_accepted(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["capture", "--model", "no.such.module:factory", "--out", str(tmp_path)])
    _one_line_error(r, "cannot load model factory")  # past the --out check
    assert [p.name for p in tmp_path.iterdir()] == []  # the probe leaves nothing behind
