"""`optwin validate --ops` reads its values as `optwin build --ops` does: `--ops a,b`, `--ops a b`, `--ops a --ops b`.

    python -m pytest -q tests/test_cli_validate_ops.py

validate took each --ops value as one operator name: `--ops rmsnorm,geodesic` stopped with `unknown operator
'rmsnorm,geodesic'` and `--ops rmsnorm geodesic` with an unexpected extra argument, while build accepts both.
The runs are CPU collections of one case per (op, dtype) with no traces (~2 s each).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SMALL = ["--device", "cpu", "--cases", "1", "--trace-calls", "0", "--no-triton"]


def _validate(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "optwin.cli", "validate", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


@pytest.mark.parametrize("ops", [
    ["--ops", "geodesic,matmul"],
    ["--ops", "geodesic", "--ops", "matmul"],  # the form that already worked still does
    ["--ops", "geodesic", "matmul"],
])
def test_ops_forms_collect_both(tmp_path: Path, ops: list[str]) -> None:
    out = tmp_path / "gpu.json"
    r = _validate([*SMALL, *ops, "--collect-only", str(out)])
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["ops"] == ["geodesic", "matmul"]


@pytest.mark.parametrize("ops,msg", [
    (["--ops", "geodesic,nosuch"], "error: unknown operator 'nosuch'; "),
    (["--ops", "geodesic", "nosuch"], "error: unknown operator 'nosuch'; "),
    (["--ops", ","], "error: --ops names no operator"),  # not read as "all"
])
def test_bad_ops_are_one_line(tmp_path: Path, ops: list[str], msg: str) -> None:
    r = _validate([*SMALL, *ops, "--collect-only", str(tmp_path / "gpu.json")])
    assert r.returncode == 2 and r.stderr.startswith(msg) and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "gpu.json").exists()
