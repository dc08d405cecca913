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


def _capture_profile(path, seed: int) -> str:
    """A real profile: an RMSNorm module's calls captured by optwin.ingest (inputs drawn with `seed`)."""
    import torch

    from optwin.ingest.capture import capture

    torch.manual_seed(seed)
    norm = torch.nn.RMSNorm(16).half()
    with torch.no_grad(), capture(norm, sample_rate=1.0, capacity=2, seed=1, ops=("rmsnorm",)) as rec:
        for _ in range(3):
            norm(torch.randn(4, 16, dtype=torch.float16) * (1 + seed))
    return str(rec.write_profile(path, model="tiny-rmsnorm"))


def test_resume_refuses_shards_of_a_profile_captured_again_or_of_other_code(tmp_path):
    """A profile is recorded in the plan by a hash of its files, not only its path: captured again under the same
    path it is another input, and --resume must not gather the old profile's shards with the new one's. Likewise
    shards of another twin version (TWIN_VERSION, bumped when the twins' numerics change; not the git revision,
    which any commit changes). The refusal is one line saying what changed; the order of --ops is no change (the
    same operators plan the same shards)."""
    import json

    import pytest

    from optwin.errors import OptwinError
    from optwin.fingerprints.build import load_or_write_manifest

    out = str(tmp_path / "fp.duckdb")
    prof = _capture_profile(tmp_path / "prof", seed=0)
    cfg = BuildConfig(out=out, profile=prof, ops=("rmsnorm",), cases=2, replays=1, seed=1, workers=1)
    load_or_write_manifest(cfg, plan_shards(cfg))  # the killed build's plan
    _capture_profile(tmp_path / "prof", seed=1)  # the same path, new contents
    with pytest.raises(OptwinError, match="different build .the profile's files differ") as e:
        build(BuildConfig(out=out, profile=prof, ops=("rmsnorm",), cases=2, replays=1, seed=1, workers=1, resume=True))
    assert "\n" not in str(e.value) and not os.path.exists(out)

    cfg = BuildConfig(out=out, ops=("matmul", "geodesic"), cases=2, replays=1, seed=1)
    first = load_or_write_manifest(cfg, plan_shards(cfg))
    again = BuildConfig(out=out, ops=("geodesic", "matmul"), cases=2, replays=1, seed=1, resume=True)
    assert load_or_write_manifest(again, plan_shards(again))["build_id"] == first["build_id"]

    path = os.path.join(out + ".work", "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    manifest["plan"]["twin_version"] = "0"  # shards of an older twin
    with open(path, "w") as f:
        json.dump(manifest, f)
    with pytest.raises(OptwinError, match=r"different build .the twin version \(0 -> "):
        build(again)
    assert "code_version" not in again.plan_key()  # a commit elsewhere must not throw away a killed build's shards


def test_resume_of_a_build_killed_after_its_swap_finishes_it_and_says_so(tmp_path):
    """Killed after the new database was swapped onto --out but before the work directory was removed, the build
    is done: --resume must say so, remove the work directory and exit 0 (not fail forever with "already in the
    database"), and the interrupt line must not claim the database is as it was. A --resume with nothing left to
    resume says so on stderr and builds afresh."""
    import shutil

    from optwin.fingerprints.cli import interrupted_message

    out, saved = str(tmp_path / "fp.duckdb"), str(tmp_path / "saved.work")
    cfg = BuildConfig(out=out, ops=("geodesic",), cases=2, replays=1, seed=4, workers=1)
    total: list[int] = []
    done: list[str] = []

    def keep_work_dir(summary):  # the state at the swap: every shard file and the manifest
        done.append(summary["shard"])
        if len(done) == total[0]:
            shutil.copytree(cfg.work_dir, saved)

    result = build(cfg, on_start=lambda n, _: total.append(n), on_shard=keep_work_dir)
    shutil.copytree(saved, cfg.work_dir)  # ... and the kill came before the cleanup
    before = open(out, "rb").read()
    msg = interrupted_message(cfg)
    assert result.build_id in msg and "is as it was" not in msg and "\n" not in msg

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "optwin.fingerprints.cli", "build", "--ops", "geodesic", "--cases", "2", "--replays",
           "1", "--seed", "4", "--workers", "1", "--out", out, "--resume"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"already holds build {result.build_id}" in r.stdout and "nothing to resume" in r.stdout, r.stdout
    assert not os.path.exists(cfg.work_dir) and open(out, "rb").read() == before
    assert "is as it was" in interrupted_message(cfg)

    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "--resume: no interrupted build in" in r.stderr and "starting a fresh build" in r.stderr, r.stderr
    with duckdb.connect(out, read_only=True) as c:
        assert c.execute("SELECT count(*) FROM builds").fetchall() == [(2,)]
