"""Import hygiene of the store and builder: only duckdb_store imports duckdb; nothing heavy at import time.

    python -m pytest -q tests/test_store_layers.py
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "optwin" / "fingerprints"


def test_imports_stay_light():
    code = ("import sys, optwin.fingerprints.store, optwin.fingerprints.cli, optwin.fingerprints.build, "
            "optwin.fingerprints.migrations; "
            "print(sorted(m for m in ('duckdb', 'ray', 'polars', 'rich', 'streamlit', 'triton') if m in sys.modules))")
    # torch is allowed: optwin.fingerprints exports the Matcher, which sketches tensors.
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_only_the_duckdb_store_imports_duckdb():
    mine = ["store.py", "build.py", "shards.py", "engines.py", "aggregate.py", "stats.py", "sources.py", "cli.py",
            "progress.py", "migrations/__init__.py", "migrations/v0001_initial.py"]
    for name in mine:
        text = (PKG / name).read_text()
        assert "import duckdb" not in text, name
    assert "import duckdb" in (PKG / "duckdb_store.py").read_text()
