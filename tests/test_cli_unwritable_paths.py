"""`optwin build --out` and `optwin demo --workdir` that cannot be written are one line naming the option.

    python -m pytest -q tests/test_cli_unwritable_paths.py

build checked its --out directory with os.access, which says yes to root in /proc, so the first write
(`<out>.lock`, after the progress display had started) failed: an empty line, then `error: [Errno 2] No such
file or directory: '/proc/x.duckdb.lock'`. demo with a plain file where its work directory goes said
`error: [Errno 17] File exists: optwin-demo`. Both are now refused before any work, naming the option and why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _optwin(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "optwin.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_build_out_in_proc(tmp_path: Path) -> None:
    # /proc refuses new files even to root, whom os.access lets through
    r = _optwin(["build", "--out", "/proc/optwin-x.duckdb", "--ops", "geodesic", "--quick"], tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr == "error: --out /proc/optwin-x.duckdb: cannot write in /proc (No such file or directory)\n"


@pytest.mark.parametrize("workdir,msg", [
    (None, "error: --workdir optwin-demo exists and is not a directory: remove it or pass another --workdir\n"),
    ("optwin-demo/sub", "error: --workdir optwin-demo/sub: {tmp}/optwin-demo is not a directory\n"),
    ("/proc/optwin-demo", "error: --workdir /proc/optwin-demo: cannot write in /proc (No such file or directory)\n"),
])
def test_demo_workdir_that_cannot_be_a_directory(tmp_path: Path, workdir: str | None, msg: str) -> None:
    (tmp_path / "optwin-demo").write_text("not a directory")  # in the cwd, where the default --workdir goes
    r = _optwin(["demo", "--fast", *(["--workdir", workdir] if workdir else [])], tmp_path)
    assert r.returncode == 2 and r.stderr == msg.format(tmp=os.path.realpath(tmp_path)), r.stderr
    assert r.stdout == ""  # refused before the build's first line
