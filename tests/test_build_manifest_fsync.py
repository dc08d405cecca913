"""The build manifest is written durably, like the shards.

    python -m pytest -q tests/test_build_manifest_fsync.py

build.py had its own copy of the atomic writer without the fsync: after a power loss manifest.json could be
empty, and the next --resume, finding it unreadable, deleted the fsynced shards with the work directory.
"""

from __future__ import annotations

import json
import os

from optwin.fingerprints import shards
from optwin.fingerprints.build import BuildConfig, load_or_write_manifest, plan_shards

ARGS = dict(ops=("geodesic",), cases=4, replays=1, seed=7, workers=1)


def test_manifest_is_fsynced_before_its_rename(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_open, real_replace = os.fsync, os.open, os.replace
    names: dict[int, str] = {}

    def opened(path, flags, *a, **k):
        fd = real_open(path, flags, *a, **k)
        names[fd] = os.fspath(path)
        return fd

    # Wrapped in the shards module only (as the shard test does): a writer of its own in build.py goes unseen.
    monkeypatch.setattr(shards.os, "open", opened)
    monkeypatch.setattr(shards.os, "fsync", lambda fd: (events.append(("fsync", names.get(fd, "?"))), real_fsync(fd)))
    monkeypatch.setattr(shards.os, "replace", lambda a, b: (events.append(("replace", os.fspath(b))),
                                                            real_replace(a, b)))
    cfg = BuildConfig(out=str(tmp_path / "fp.duckdb"), **ARGS)
    manifest = load_or_write_manifest(cfg, plan_shards(cfg))
    path = os.path.join(cfg.work_dir, "manifest.json")
    assert ("replace", path) in events
    tmp = next(p for e, p in events if e == "fsync" and p.startswith(path + ".tmp-"))
    assert events.index(("fsync", tmp)) < events.index(("replace", path))
    assert ("fsync", cfg.work_dir) in events[events.index(("replace", path)):]
    assert json.load(open(path)) == manifest
    assert sorted(os.listdir(cfg.work_dir)) == ["manifest.json", "shards"]  # no temporary file left
