"""Profiles are written whole: two captures racing to one directory never leave a mixed profile.

    python -m pytest -q tests/test_ingest_profile_atomic.py
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from optwin.errors import ProfileError
from optwin.ingest import read_profile
from optwin.ingest.capture import Recorder, capture
from optwin.ingest.profile import write_profile

# Two captures told apart by every file: row width (sketch numel, sample shape), call count, model.
SHAPES = {"A": (64, 128), "B": (4, 8)}  # A small: every write and read hashes it
CALLS = {"A": 12, "B": 7}


def _record(who: str) -> Recorder:
    g = torch.Generator().manual_seed(len(who))
    with capture(sample_rate=1.0, capacity=64, seed=1) as rec:
        for _ in range(CALLS[who]):
            torch.softmax(torch.randn(*SHAPES[who], generator=g), -1)
    return rec


def _whole(d: Path) -> str:
    """Read d and check every file came from the same capture; return which one."""
    p = read_profile(d)
    who = p.meta["model"]
    rows, n = SHAPES[who]
    assert p.sketches.height == CALLS[who] and len(p.index) == CALLS[who], (who, p.sketches.height, len(p.index))
    assert set(p.sketches["numel"].to_list()) == {float(rows * n)}, who
    try:
        assert tuple(p.sample(0).inputs["x"].shape) == (rows, n), who
    except ProfileError as e:  # replaced after the read: the lazy sample load refuses, it does not mix
        assert "read the profile again" in str(e)
    return who


def test_racing_writers_leave_one_whole_profile_and_readers_never_see_a_mix(tmp_path: Path) -> None:
    recs = {w: _record(w) for w in SHAPES}
    out = tmp_path / "prof"
    write_profile(out, recs["B"], model="B")
    seen: dict[str, int] = {}
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(who: str) -> None:
        try:
            for _ in range(6):
                write_profile(out, recs[who], model=who)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def reader() -> None:
        try:
            while not stop.is_set():
                try:
                    w = _whole(out)
                except ProfileError as e:  # outrun by back-to-back writes: a clean refusal, never a mix
                    if "during each of 5 reads" not in str(e):
                        raise
                    w = "refused"
                seen[w] = seen.get(w, 0) + 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in SHAPES]
    r = threading.Thread(target=reader)
    r.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    time.sleep(0.05)
    stop.set()
    r.join(60)
    assert not errors, repr(errors[0])
    assert seen.get("A", 0) + seen.get("B", 0) > 0, seen
    _whole(out)  # the last writer's profile, whole
    # Nothing left behind: no temporary or set-aside directories next to the profile.
    assert sorted(x.name for x in tmp_path.iterdir()) == ["prof"]
    assert sorted(x.name for x in out.iterdir()) == ["profile.json", "sketches.parquet", "tensors.safetensors",
                                                     "tensors_index.json"]


def test_profile_read_before_a_rewrite_refuses_the_new_tensors(tmp_path: Path) -> None:
    recs = {w: _record(w) for w in SHAPES}
    write_profile(tmp_path / "p", recs["A"], model="A")
    old = read_profile(tmp_path / "p")
    write_profile(tmp_path / "p", recs["B"], model="B")
    with pytest.raises(ProfileError, match="written by another capture since this profile was read"):
        old.sample(0)
    assert _whole(tmp_path / "p") == "B"


def test_a_directory_holding_other_files_is_not_replaced(tmp_path: Path) -> None:
    rec = _record("B")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ProfileError, match="holds notes.txt besides profile files"):
        write_profile(tmp_path, rec, model="B")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ProfileError, match="exists and is not a directory"):
        write_profile(tmp_path / "file", rec, model="B")
    # An empty directory, and a symlink to a profile directory (the link stays, its target is replaced).
    (tmp_path / "empty").mkdir()
    assert _whole(write_profile(tmp_path / "empty", rec, model="B")) == "B"
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    write_profile(tmp_path / "link", _record("A"), model="A")
    assert (tmp_path / "link").is_symlink() and _whole(tmp_path / "empty") == "A"


def test_capture_refuses_such_a_directory_before_loading_the_model(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from optwin.ingest.cli import capture_command

    app = typer.Typer()
    app.command("capture")(capture_command)
    app.command("noop")(lambda: None)  # two commands: typer keeps "capture" as a subcommand name
    (tmp_path / "texts.txt").write_text("hello\n")
    # An unknown model would fail at load: the --out error coming first shows the check runs before it.
    r = CliRunner().invoke(app, ["capture", "--model", "gpt-17", "--out", str(tmp_path)])
    assert r.exit_code != 0 and isinstance(r.exception, ProfileError), r.output
    assert "holds texts.txt besides profile files" in str(r.exception) and "\n" not in str(r.exception)
