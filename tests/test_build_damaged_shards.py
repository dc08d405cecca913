"""Damaged shard files in a work directory are run again by --resume, and shard files are written durably.

    python -m pytest -q tests/test_build_damaged_shards.py

A crash on a filesystem that loses unsynced data can leave a zero-length file under a shard's final name. --resume
trusted any file that existed: a zero-length summary failed with a JSONDecodeError traceback after the whole run,
a zero-length Parquet file failed the gather with an error blaming the database, and every later --resume again.
"""

from __future__ import annotations

import os

import duckdb

from _durable import watch_durable_writes
from optwin.fingerprints import shards
from optwin.fingerprints.build import BuildConfig, build, plan_shards
from optwin.fingerprints.shards import run_shard, shard_path, summary_path

ARGS = dict(ops=("geodesic",), cases=4, replays=1, seed=7, workers=1)


class _Stop(Exception):
    pass


def _interrupted_build(out: str) -> list[str]:
    """A real build stopped after its third shard (the progress callback raises): the work directory keeps the
    manifest and the finished shards, as after a kill. Returns those shards."""
    done: list[str] = []

    def on_shard(summary: dict) -> None:
        done.append(summary["shard"])
        if len(done) == 3:
            raise _Stop

    try:
        build(BuildConfig(out=out, **ARGS), on_shard=on_shard)
    except _Stop:
        pass
    return done


def _cases(path: str) -> list[tuple]:
    with duckdb.connect(path, read_only=True) as c:
        return c.execute("SELECT * EXCLUDE (build_id) FROM cases JOIN outcomes USING (build_id, case_id) "
                         "ORDER BY case_id").fetchall()


def test_resume_runs_shards_with_zero_length_files_again_and_says_so(tmp_path):
    out = str(tmp_path / "fp.duckdb")
    _interrupted_build(out)
    work = out + ".work"
    order = [s.shard_id for s in plan_shards(BuildConfig(**ARGS))]
    done = [s for s in order if os.path.exists(shard_path(work, s))]  # the pool may finish one more than it reported
    assert 3 <= len(done) < len(order)
    open(summary_path(work, done[0]), "w").close()  # zero-length summary, Parquet file intact
    open(shard_path(work, done[1]), "w").close()  # zero-length Parquet file, summary intact
    notes: list[str] = []
    seen: list[str] = []
    result = build(BuildConfig(out=out, resume=True, **ARGS), on_shard=lambda s: seen.append(s["shard"]),
                   on_note=notes.append)
    assert set(done[:2]) <= set(seen) and not set(done[2:]) & set(seen)  # the damaged two ran again, no sound one
    assert result.shards_skipped == len(done) - 2 and result.shards_run == len(order) - len(done) + 2
    assert notes == [f"--resume: 2 finished shard(s) in {work} have unreadable files and run again: "
                     f"{done[0]}, {done[1]}"]
    fresh = str(tmp_path / "fresh.duckdb")
    build(BuildConfig(out=fresh, **ARGS))
    assert _cases(out) == _cases(fresh) and _cases(out)


def test_shard_files_are_fsynced_before_their_rename(tmp_path, monkeypatch):
    """The data reaches the disk before the file gets its final name (the order that makes a crash leave either
    no file or the whole file), and no temporary file is left."""
    events = watch_durable_writes(monkeypatch, shards)
    spec = plan_shards(BuildConfig(**ARGS))[0]
    run_shard(spec.to_dict(), str(tmp_path))
    replaced = [e[1] for e in events if e[0] == "replace"]
    assert len(replaced) == 2  # the summary, then the Parquet file
    for tmp in replaced:
        at = next(i for i, e in enumerate(events) if e[:2] == ("replace", tmp))
        assert events.index(("fsync", tmp)) < at
        assert ("fsync", os.path.dirname(tmp)) in events[at:]
    assert sorted(os.listdir(tmp_path / "shards")) == sorted(
        os.path.basename(p) for p in (shard_path(str(tmp_path), spec.shard_id), summary_path(str(tmp_path), spec.shard_id)))
