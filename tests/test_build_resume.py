"""A build SIGKILLed mid-way and resumed with --resume equals an uninterrupted build with the same seed.

    python -m pytest -q tests/test_build_resume.py
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import duckdb

from optwin.fingerprints.build import BuildConfig, build, plan_shards

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ["--ops", "rmsnorm,layernorm", "--cases", "8", "--replays", "4", "--seed", "5"]


def _fingerprints(path: str) -> list[tuple]:
    with duckdb.connect(path, read_only=True) as c:
        return c.execute("SELECT * EXCLUDE (build_id) FROM fingerprints ORDER BY ALL").fetchall()


def _cases(path: str) -> list[tuple]:
    with duckdb.connect(path, read_only=True) as c:
        return c.execute("SELECT * EXCLUDE (build_id) FROM cases JOIN outcomes USING (build_id, case_id) ORDER BY case_id").fetchall()


def test_killed_build_resumes_without_redoing_or_duplicating_shards(tmp_path):
    out = str(tmp_path / "fp.duckdb")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "optwin.fingerprints.cli", "build", *ARGS, "--workers", "1", "--out", out],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    shard_glob = os.path.join(out + ".work", "shards", "*.parquet")
    deadline = time.monotonic() + 120
    while len(glob.glob(shard_glob)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its pool worker: our own process group
    proc.wait()
    done_before = {p: os.stat(p).st_mtime_ns for p in glob.glob(shard_glob)}
    total = len(plan_shards(BuildConfig(ops=("rmsnorm", "layernorm"), cases=8, replays=4, seed=5)))
    assert 2 <= len(done_before) < total, "the kill must land mid-build"
    assert not os.path.exists(out), "no database may appear before the gather"

    cfg = BuildConfig(out=out, ops=("rmsnorm", "layernorm"), cases=8, replays=4, seed=5, workers=2, resume=True)
    seen: list[str] = []
    resumed = build(cfg, on_shard=lambda s: seen.append(s["shard"]))
    assert resumed.shards_skipped == len(done_before) and resumed.shards_run == total - len(done_before)
    finished = {os.path.basename(p)[: -len(".parquet")] for p in done_before}
    assert not finished & set(seen), "finished shards were redone"

    fresh = str(tmp_path / "fresh.duckdb")
    build(BuildConfig(out=fresh, ops=("rmsnorm", "layernorm"), cases=8, replays=4, seed=5, workers=2))
    assert _fingerprints(out) == _fingerprints(fresh) and len(_fingerprints(out)) > 0
    assert _cases(out) == _cases(fresh)  # no duplicated or missing case either
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p or p.endswith(".work")]


def test_resume_refuses_a_work_dir_of_another_plan(tmp_path):
    import pytest

    from optwin.errors import OptwinError
    from optwin.fingerprints.build import load_or_write_manifest

    out = str(tmp_path / "fp.duckdb")
    cfg = BuildConfig(out=out, ops=("geodesic",), cases=4, replays=2, seed=1)
    load_or_write_manifest(cfg, plan_shards(cfg))
    other = BuildConfig(out=out, ops=("geodesic",), cases=4, replays=2, seed=2, resume=True)
    with pytest.raises(OptwinError, match="different build"):
        build(other)
