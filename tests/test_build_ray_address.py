"""`optwin build --engine ray --address` naming no reachable cluster: one `error:` line, at once.

    python -m pytest -q tests/test_build_ray_address.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _build(tmp_path, address: str, **env_extra: str) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **env_extra)
    out = str(tmp_path / "fp.duckdb")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "optwin.fingerprints.cli", "build", "--engine", "ray", "--address",
                        address, "--ops", "geodesic", "--cases", "2", "--replays", "1", "--out", out], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    return r, time.monotonic() - t0


def test_an_address_nothing_listens_at_is_one_error_line_at_once(tmp_path):
    """ray.init retried a closed port for minutes with nothing but Ray's warnings (> 150 s): a bounded TCP probe
    now refuses it first, naming the address."""
    r, took = _build(tmp_path, "127.0.0.1:1")
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert "--address 127.0.0.1:1" in errors[0] and "Ray cluster" in errors[0], errors
    # Well under ray.init's retries (> 150 s); the time includes interpreter start and `import ray` on a loaded
    # 2-core machine, hence the margin.
    assert took < 60 and "Traceback" not in r.stderr
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".lock")]

    r, _ = _build(tmp_path, "127.0.0.1:1", OPTWIN_RAY_CONNECT_TIMEOUT_S="soon")
    assert r.returncode == 2 and "error: OPTWIN_RAY_CONNECT_TIMEOUT_S='soon'" in r.stderr, r.stderr


def test_a_bad_address_is_refused_before_the_work_directory_is_made(tmp_path, monkeypatch):
    """The probe ran inside run_shards, after the lock, the WAL fold and the manifest write: a refused address
    left <out>.work/manifest.json behind (and a later build without --resume said it was discarding a build)."""
    import pytest

    from optwin.errors import OptwinError
    from optwin.fingerprints.build import BuildConfig, build

    out = str(tmp_path / "fp.duckdb")
    cfg = BuildConfig(out=out, engine="ray", address="127.0.0.1:1", ops=("geodesic",), cases=2, replays=1)
    with pytest.raises(OptwinError, match="--address 127.0.0.1:1"):
        build(cfg)
    monkeypatch.setenv("OPTWIN_RAY_CONNECT_TIMEOUT_S", "soon")
    with pytest.raises(OptwinError, match="OPTWIN_RAY_CONNECT_TIMEOUT_S='soon'"):
        build(cfg)
    assert os.listdir(tmp_path) == []  # no work directory, no lock file, no database
