"""A write removes the unfinished temp directories a killed write of the same profile left.

    python -m pytest -q tests/test_ingest_profile_stale_tmp.py

A SIGKILLed write_profile leaves `.<name>.tmp-<pid>-*` beside the profile; nothing removed them.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
import torch

from optwin.ingest import read_profile
from optwin.ingest.capture import capture
from optwin.ingest.profile import write_profile

DEAD = 999_999_999  # above any pid_max: no such process


def test_stale_unfinished_tmp_dirs_are_removed_with_a_note(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def tmp(pid: int, tag: str, whole: bool = False, age: float = 0.0) -> Path:
        d = tmp_path / f".p.tmp-{pid}-{tag}"
        d.mkdir()
        (d / "sketches.parquet").write_bytes(b"partial")
        if whole:
            (d / "profile.json").write_text("{}")
        if age:
            t = time.time() - age
            os.utime(d, (t, t))
        return d

    dead = tmp(DEAD, "aaaa0000")  # its writer was killed
    old = tmp(os.getpid(), "bbbb0000", age=7200)  # a live pid, but two hours without a change
    live = tmp(os.getpid(), "cccc0000")  # a write in progress
    kept = tmp(DEAD, "dddd0000", whole=True)  # a whole profile a failed rename left, named in its error
    other = tmp_path / f".q.tmp-{DEAD}-eeee0000"  # another profile's
    other.mkdir()
    with capture(sample_rate=1.0, capacity=4, seed=0) as rec:
        torch.softmax(torch.randn(2, 4), -1)
    with caplog.at_level(logging.WARNING, logger="optwin.ingest.profile"):
        write_profile(tmp_path / "p", rec, model="m")
    assert read_profile(tmp_path / "p").sketches.height == 1
    assert not dead.exists() and not old.exists()
    assert live.exists() and kept.exists() and other.exists()
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 2 and all("unfinished profile write" in n for n in notes), notes
