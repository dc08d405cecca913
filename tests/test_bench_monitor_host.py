"""bench/monitor_host.py (--smoke) and bench/monitor_calls.py run end to end: the monitor's host cost tables for the live
package, against a real fixture database. Timings are the bench's job, not the test's.

    python -m pytest -q tests/test_bench_monitor_host.py
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

from _matcher_fixture import cached_db

ROOT = Path(__file__).resolve().parents[1]


def test_monitor_host_bench_reports_every_config(tmp_path):
    db = cached_db(str(tmp_path / "fp.duckdb"))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "monitor_host.py"), "--smoke", "--db", db],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in out.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| config")}
    assert set(rows) == {"as is", "live: monitor (rmsnorm, rope)", "live: monitor (all ops)"}
    for name, cells in rows.items():
        assert math.isfinite(float(cells[0])) and float(cells[0]) > 0, name
    # in --smoke the monitor is still in its sampling warm-up: every call of a watched op is checked
    assert int(rows["live: monitor (all ops)"][5]) > int(rows["live: monitor (rmsnorm, rope)"][5]) > 0  # calls checked


def test_monitor_calls_bench_reports_a_cost_per_call(tmp_path):
    db = cached_db(str(tmp_path / "fp.duckdb"))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "monitor_calls.py"), "--rounds", "1", "--forwards", "30",
                          "--db", db], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in out.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| config")}
    assert set(rows) == {"as is", "live"}
    assert float(rows["live"][0]) > 0 and math.isfinite(float(rows["live"][2]))  # µs per forward, per call
