"""`optwin capture --help` lists every built-in model name that --model accepts.

    python -m pytest -q tests/test_cli_capture_help_models.py

The help was typed by hand as `minilm | llama-tiny | llama-tiny-eager | PACKAGE.MODULE:FACTORY` while
load_model also accepts minilm-eager; it is now built from load_model's own table.
"""

from __future__ import annotations

import os
import subprocess
import sys

from optwin.ingest.models import _BUILTIN


def test_help_names_every_builtin_model() -> None:
    # COLUMNS: rich wraps the help to the terminal; wide enough that --model's help stays on one line
    r = subprocess.run([sys.executable, "-m", "optwin.cli", "capture", "--help"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "COLUMNS": "250"})
    assert r.returncode == 0, r.stderr
    assert "minilm-eager" in _BUILTIN  # the name the hand-typed help lacked
    assert " | ".join([*_BUILTIN, "PACKAGE.MODULE:FACTORY"]) in r.stdout, r.stdout
