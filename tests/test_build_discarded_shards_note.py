"""A build without --resume says so when it deletes an interrupted build's finished shards.

    python -m pytest -q tests/test_build_discarded_shards_note.py

Starting over is right without --resume, but it was silent: rerunning the same command after Ctrl-C threw away
the finished shards (maybe an hour of replays) without a word that --resume would have kept them.
"""

from __future__ import annotations

import os

from optwin.fingerprints.build import BuildConfig, build

ARGS = dict(ops=("geodesic",), cases=4, replays=1, workers=1)


class _Stop(Exception):
    pass


def _build(out: str, seed: int, notes: list[str], stop_after: int | None = None) -> int:
    """A real build (stopped after `stop_after` shards by its progress callback, as after Ctrl-C: the work directory
    keeps its manifest and finished shards); returns how many finished shards it left."""
    done: list[str] = []

    def on_shard(summary: dict) -> None:
        done.append(summary["shard"])
        if stop_after is not None and len(done) == stop_after:
            raise _Stop

    try:
        build(BuildConfig(out=out, seed=seed, **ARGS), on_shard=on_shard, on_note=notes.append)
    except _Stop:
        pass
    shards = os.path.join(out + ".work", "shards")
    return sum(p.endswith(".parquet") for p in os.listdir(shards)) if os.path.isdir(shards) else 0


def test_discarding_an_interrupted_builds_shards_is_said_in_one_line(tmp_path):
    out = str(tmp_path / "fp.duckdb")
    work = out + ".work"
    notes: list[str] = []
    left = _build(out, 7, notes, stop_after=2)
    assert left >= 2 and notes == []  # nothing to discard the first time
    left_again = _build(out, 8, notes, stop_after=2)  # other options: --resume could not have kept them
    assert notes == [f"discarding {left} finished shard(s) of an interrupted build with other options in {work}"]
    notes.clear()
    assert _build(out, 8, notes) == 0  # the same command again, without --resume
    assert notes == [f"discarding {left_again} finished shard(s) of an interrupted build in {work}: --resume would "
                     "have kept them"]
