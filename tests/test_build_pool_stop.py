"""Stopping `optwin build` while its process pool runs: real signals to a real CLI build.

    python -m pytest -q tests/test_build_pool_stop.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from _procs import alive, children, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _start(out: str, cases: int) -> tuple[subprocess.Popen, set[int]]:
    """A layernorm build on 2 workers, in its own process group (a terminal's Ctrl-C reaches the whole group),
    returned once its pool has started: the 2 workers and spawn's resource tracker are its children."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-m", "optwin.fingerprints.cli", "build", "--ops", "layernorm", "--cases",
                          str(cases), "--replays", "4", "--workers", "2", "--out", out], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert wait_for(lambda: len(children(p.pid)) >= 3 or p.poll() is not None, 120.0)
    assert p.poll() is None, p.communicate()
    return p, children(p.pid)


def _cpu_s(pid: int) -> float:
    """CPU seconds a process has used (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().split(")")[-1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _send(p: subprocess.Popen, sig: signal.Signals, group: bool) -> None:
    if p.poll() is None:
        os.killpg(p.pid, sig) if group else p.send_signal(sig)


def test_a_second_signal_while_the_build_stops_exits_promptly(tmp_path):
    """Ctrl-C twice (to the whole group) or SIGTERM twice (to the builder only) during the run phase: the builder
    stopped by waiting for its workers' running shards, and the second signal left it hung in the exit handlers'
    joins of those workers. Shards here take far longer than the limit, so waiting for them fails too. Several
    tries, with the second signal at different points of the stop: the hang was a race."""
    tries = [(signal.SIGTERM, False, True, 0.3), (signal.SIGINT, True, True, 0.05), (signal.SIGINT, True, False, 0.3)]
    # (signal, to the whole group, workers busy first, gap)
    for i, (sig, group, busy, gap) in enumerate(tries):
        out = str(tmp_path / f"fp{i}.duckdb")
        p, kids = _start(out, cases=512)  # a shard takes ~30 s
        try:
            # busy: the workers are into their shards (their imports take ~1.2 s of CPU), as in the hang reported
            assert not busy or wait_for(lambda: sum(_cpu_s(k) > 2.0 for k in kids) >= 2 or p.poll() is not None, 60.0)
            _send(p, sig, group)
            t0 = time.monotonic()
            time.sleep(gap)
            _send(p, sig, group)
            _, err = p.communicate(timeout=15)
            took = time.monotonic() - t0
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        # 130 from the interrupt path; a second signal that lands after it, while Python finalizes (its own
        # handlers gone), ends the process by that signal: prompt either way.
        assert p.returncode in (130, -signal.SIGINT, -signal.SIGTERM), (i, p.returncode, err)
        assert took < 15 and "interrupted" in err, (i, took, err)
        assert wait_for(lambda: not any(alive(k) for k in kids), 10.0), (i, [k for k in kids if alive(k)])
        assert not os.path.exists(out), i
        assert os.path.exists(os.path.join(out + ".work", "manifest.json")), i  # what --resume continues from


def test_ctrl_c_as_the_pool_starts_prints_only_the_interrupted_line(tmp_path):
    """Ctrl-C reaches the workers too. While they imported torch it printed their KeyboardInterrupt tracebacks, and
    the builder's cancelled futures made the pool's manager thread die of InvalidStateError: ~65 lines before the
    one that matters. Workers ignore SIGINT (the builder stops them) from their start, so nothing but the progress
    line and the interrupted line is printed."""
    for i, delay in enumerate((0.05, 0.8)):  # the workers spawning, then importing
        out = str(tmp_path / f"fp{i}.duckdb")
        p, kids = _start(out, cases=96)
        try:
            time.sleep(delay)
            _send(p, signal.SIGINT, group=True)
            _, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        assert p.returncode == 130, (i, p.returncode, err)
        assert len(err.splitlines()) <= 3 and "interrupted:" in err and "Traceback" not in err, (i, err)
        assert wait_for(lambda: not any(alive(k) for k in kids), 10.0), (i, [k for k in kids if alive(k)])
