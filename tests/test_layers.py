"""Layering: the core packages never pull in the dashboard, and the matcher's import path (which
runs inside inference processes) stays free of heavy imports. Each check runs in a fresh interpreter."""

import json
import subprocess
import sys

import pytest

HEAVY_FOR_MATCHER = ("streamlit", "triton", "ray", "optwin.dashboard", "altair")


def _modules_after(stmt: str) -> set[str]:
    code = f"import sys, json; {stmt}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("pkg", ["optwin.twin", "optwin.ingest", "optwin.fingerprints", "optwin.kernels"])
def test_core_packages_never_import_dashboard(pkg):
    mods = _modules_after(f"import {pkg}")
    assert not {m for m in mods if m.startswith(("streamlit", "optwin.dashboard"))}, pkg


def test_matcher_import_path_is_light():
    mods = _modules_after("from optwin.fingerprints import Matcher")
    heavy = {m for m in mods if m.split(".")[0] in {h.split(".")[0] for h in HEAVY_FOR_MATCHER} and m.startswith(HEAVY_FOR_MATCHER)}
    assert not heavy, sorted(heavy)


def test_import_optwin_is_light():
    mods = _modules_after("import optwin")
    assert "torch" not in mods and "duckdb" not in mods
