"""A pool worker of `optwin build` killed (the OOM killer's SIGKILL): one `error:` line, shards kept for --resume.

    python -m pytest -q tests/test_build_worker_death.py
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

from _procs import children

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ["--ops", "matmul", "--cases", "160", "--replays", "2", "--workers", "2"]  # 12 shards of ~1.5 s


def _pool_workers(pid: int) -> list[int]:
    """The builder's pool workers: its spawned children, less multiprocessing's resource tracker."""
    out = []
    for k in sorted(children(pid)):
        try:
            with open(f"/proc/{k}/cmdline", "rb") as f:
                cmd = f.read()
        except FileNotFoundError:
            continue
        if b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            out.append(k)
    return out


def test_a_killed_worker_is_one_error_line_and_resume_continues(tmp_path):
    out = str(tmp_path / "fp.duckdb")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "optwin.fingerprints.cli", "build", *ARGS, "--out", out]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    shards = os.path.join(out + ".work", "shards", "*.parquet")
    try:
        deadline = time.monotonic() + 120
        while len(glob.glob(shards)) < 2 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        workers = _pool_workers(p.pid)
        assert p.poll() is None and workers, p.communicate()
        os.kill(workers[0], signal.SIGKILL)  # what the out-of-memory killer sends
        kept = set(glob.glob(shards))
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err and len(err.splitlines()) <= 3, err
    assert f"pid {workers[0]}" in errors[0] and "SIGKILL" in errors[0] and "out-of-memory" in errors[0], errors
    assert "--resume" in errors[0] and out + ".work" in errors[0], errors
    assert kept and kept <= set(glob.glob(shards)) and not os.path.exists(out)

    r = subprocess.run([*cmd, "--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(out) and not os.path.exists(out + ".work")
    resumed = int(r.stdout.split(" resumed;")[0].split()[-1])  # "... shards run, N resumed; ..."
    assert resumed >= len(kept), r.stdout
