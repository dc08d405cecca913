"""bench/gpu_twin.py runs end to end with the CPU standing in for the GPU.

    python -m pytest -q tests/test_twin_gpu_script.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_twin_script_smoke_on_cpu(tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_twin.py"), "--device", "cpu", "--smoke",
                           "--workers", "2", "--ops", "rmsnorm,rope,layernorm,geodesic"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = proc.stdout.strip().splitlines()
    assert table[-1].startswith("| **all** |")  # the markdown table is last
    data = json.loads((tmp_path / "twin_gpu.json").read_text())
    rows = data["triples"]
    assert {(r["op"], r["variant"]) for r in rows} >= {("rope", "low-precision-angles"), ("geodesic", "acos")}
    assert len(rows) == 6 + 6 + 6 + 2
    for r in rows:
        assert r["cases"] == 6 and r["device_errors"] == 0, r
        assert 0.0 <= r["flag_agreement"] <= 1.0 and 0.0 <= r["coverage"] <= 1.0
        assert set(r["coverage_by_noise"]) == {"none", "stochastic", "mca", "order"}
    # The CPU runs the same production code: the deterministic twin agrees on most cases.
    agree = sum(r["flag_agreement"] for r in rows) / len(rows)
    assert agree > 0.9, agree
    assert (tmp_path / "twin_gpu.md").read_text().strip().splitlines()[-1] == table[-1]


def test_gpu_twin_script_refuses_missing_cuda_and_unknown_ops() -> None:
    script = str(ROOT / "bench" / "gpu_twin.py")
    bad = subprocess.run([sys.executable, script, "--device", "cpu", "--ops", "nope"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode != 0 and "unknown ops" in (bad.stdout + bad.stderr)
    import torch

    if not torch.cuda.is_available():
        r = subprocess.run([sys.executable, script, "--smoke"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stdout.startswith("error:")
