"""`optwin build --profile DIR/profile.json` says to pass DIR, not to capture into a file's path.

    python -m pytest -q tests/test_cli_profile_path.py

A profile is a directory; pointing --profile at its profile.json (an easy slip: it is the file that names the
profile) said `no profile directory at DIR/profile.json: run optwin capture --out DIR/profile.json`, advice that
capture itself refuses since the path is a file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name,msg", [
    ("cap/profile.json", "error: {p} is a file of the profile in {d}: pass that directory"),
    ("notes.txt", "error: {p} is a file, not a profile directory (`optwin capture --out DIR` writes one)"),
])
def test_a_file_given_as_profile_names_the_fix(tmp_path: Path, name: str, msg: str) -> None:
    # the check is on the path's shape, before profile.json is read, so an empty object stands in for a capture's
    (tmp_path / "cap").mkdir()
    (tmp_path / "cap" / "profile.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("x")
    path, out = tmp_path / name, tmp_path / "fp.duckdb"
    r = subprocess.run([sys.executable, "-m", "optwin.cli", "build", "--profile", str(path), "--ops", "geodesic",
                        "--quick", "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and r.stderr == msg.format(p=path, d=path.parent) + "\n", r.stderr
    assert not out.exists()
