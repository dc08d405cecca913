"""The build manifest is written durably, like the shards.

    python -m pytest -q tests/test_build_manifest_fsync.py

build.py had its own copy of the atomic writer without the fsync: after a power loss manifest.json could be
empty, and the next --resume, finding it unreadable, deleted the fsynced shards with the work directory.
"""

from __future__ import annotations

import json
import os

from _durable import watch_durable_writes
from optwin.fingerprints import shards
from optwin.fingerprints.build import BuildConfig, load_or_write_manifest, plan_shards

ARGS = dict(ops=("geodesic",), cases=4, replays=1, seed=7, workers=1)


def test_manifest_is_fsynced_before_its_rename(tmp_path, monkeypatch):
    # watched in the shards module only: a writer of its own in build.py would go unseen
    events = watch_durable_writes(monkeypatch, shards)
    cfg = BuildConfig(out=str(tmp_path / "fp.duckdb"), **ARGS)
    manifest = load_or_write_manifest(cfg, plan_shards(cfg))
    path = os.path.join(cfg.work_dir, "manifest.json")
    at = next(i for i, e in enumerate(events) if e[0] == "replace" and e[2] == path)
    tmp = next(e[1] for e in events if e[0] == "fsync" and e[1].startswith(path + ".tmp-"))
    assert events.index(("fsync", tmp)) < at
    assert ("fsync", cfg.work_dir) in events[at:]
    assert json.load(open(path)) == manifest
    assert sorted(os.listdir(cfg.work_dir)) == ["manifest.json", "shards"]  # no temporary file left
