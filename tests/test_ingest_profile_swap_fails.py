"""A profile that cannot be renamed into place is kept, and an --out that would fail so is refused
before the capture.

    python -m pytest -q tests/test_ingest_profile_swap_fails.py

For an --out that is a mount point (docker -v) the final rename raised EXDEV/EBUSY after the
capture had run, and write_profile then deleted the written profile with its temporary directory.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

import optwin.ingest.profile as prof_mod
from optwin.errors import ProfileError
from optwin.ingest import read_profile
from optwin.ingest.capture import capture
from optwin.ingest.profile import check_profile_target, write_profile


def _rec():  # noqa: ANN202
    with capture(sample_rate=1.0, capacity=4, seed=0) as rec:
        for _ in range(3):
            torch.softmax(torch.randn(2, 4), -1)
    return rec


def test_failed_rename_keeps_the_written_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _rec()

    def rename(a, b):  # noqa: ANN001, ANN202  root ignores chmod: simulate the mount point's refusal
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(b))

    monkeypatch.setattr(prof_mod.os, "rename", rename)
    with pytest.raises(ProfileError) as ei:
        write_profile(tmp_path / "p", rec, model="m")
    monkeypatch.undo()
    msg = str(ei.value)
    assert "\n" not in msg and "cannot rename the written profile into place" in msg, msg
    kept = [d for d in tmp_path.iterdir() if d.name.startswith(".p.tmp-")]
    assert len(kept) == 1 and str(kept[0]) in msg
    assert read_profile(kept[0]).sketches.height == 3  # the capture survives, whole


def test_a_mount_point_out_is_refused_before_the_capture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "mnt"
    out.mkdir()
    check_profile_target(out)  # same file system, writable parent: fine
    real_stat = os.stat

    def stat(p, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202  `out` on another device, as a bind mount is
        st = real_stat(p, *a, **k)
        if Path(p) == out:
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev + 1) + tuple(st)[3:])
        return st

    monkeypatch.setattr(prof_mod.os, "stat", stat)
    with pytest.raises(ProfileError, match="a mount point") as ei:
        check_profile_target(out)
    assert "\n" not in str(ei.value) and str(out / "profile") in str(ei.value)
