"""Process checks the tests of builds, the sidecar and the dashboard share: a pid's children, whether a pid
still runs (a zombie has exited), and a bounded wait for a condition."""

from __future__ import annotations

import subprocess
import time
from typing import Callable


def children(pid: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def wait_for(cond: Callable[[], bool], timeout_s: float, step_s: float = 0.05) -> bool:
    """cond() once it holds, polled every step_s; its last value at the deadline."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step_s)
    return cond()
