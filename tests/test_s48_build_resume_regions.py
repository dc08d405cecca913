"""`optwin build --resume` refuses the shards of a build started on another region grid.

    python -m pytest -q tests/test_s48_build_resume_regions.py

Shards store each case's region key, binned when the shard ran. The plan key covered the options and the twin
version but not the grid, so a layernorm build killed under an older optwin (3 region features, before the derived
const_odd_width) and resumed under this one gathered 3- and 4-bin regions into one fingerprints table: the build
said it succeeded and the matcher then refused the database. Here the "older optwin" is this one with the grid
patched in-process: the killed build's manifest and one finished shard are made under the patched grid (the shard
runs in this process: the build's pool workers are spawned and would not see the patch), the patch is undone, and
the resume must be refused in one line; a build without --resume then makes a database the matcher opens.
"""

from __future__ import annotations

import dataclasses
import os

import duckdb
import pytest

from optwin import catalog
from optwin.errors import OptwinError
from optwin.fingerprints import regions
from optwin.fingerprints.build import BuildConfig, build, load_or_write_manifest, plan_shards
from optwin.fingerprints.matcher import Matcher
from optwin.fingerprints.shards import run_shard


def _older_features(monkeypatch):
    # layernorm before const_odd_width existed: three region features, nothing derived
    old = dataclasses.replace(catalog.CATALOG["layernorm"],
                              region_features=("max_mean_over_std", "absmax", "const_absmax"))
    monkeypatch.setitem(catalog.CATALOG, "layernorm", old)
    monkeypatch.setitem(regions.DERIVED, "layernorm", ())


def _other_binning(monkeypatch):
    # the same features, absmax binned 4 per octave instead of 2: same key lengths, other cells
    monkeypatch.setitem(regions._BINNING, "absmax", (regions._TINY, 4))


def _cfg(out: str, resume: bool = False) -> BuildConfig:
    return BuildConfig(out=out, ops=("layernorm",), cases=4, replays=2, seed=3, workers=2, include_triton=False,
                       resume=resume)


@pytest.mark.parametrize("older", [_older_features, _other_binning])
def test_resume_across_a_region_grid_change_is_refused(tmp_path, monkeypatch, older):
    out = str(tmp_path / "fp.duckdb")
    with monkeypatch.context() as m:
        older(m)
        cfg = _cfg(out)
        specs = plan_shards(cfg)
        load_or_write_manifest(cfg, specs)  # the killed build's plan, made on the older grid
        summary = run_shard(specs[0].to_dict(), cfg.work_dir)  # ... and its one finished shard
        assert summary["shard"] == specs[0].shard_id and len(specs) > 1
    with pytest.raises(OptwinError, match=r"different build .the region grid of layernorm differ") as e:
        build(_cfg(out, resume=True))
    assert "\n" not in str(e.value) and not os.path.exists(out)
    assert os.path.exists(os.path.join(cfg.work_dir, "shards", specs[0].shard_id + ".parquet"))  # kept, not gathered

    if older is _older_features:  # the refusal's advice, followed: start over, and the matcher opens the result
        build(_cfg(out))
        with duckdb.connect(out, read_only=True) as c:
            lengths = {n for (n,) in c.execute("SELECT DISTINCT len(string_split(region, '|')) FROM fingerprints").fetchall()}
        assert lengths == {len(catalog.CATALOG["layernorm"].region_features)}
        Matcher.open(out)


def test_an_older_manifest_without_a_grid_is_refused(tmp_path):
    """A work dir left by an optwin whose plan had no grid at all: its shards' grid is unknown, so not reused."""
    import json

    out = str(tmp_path / "fp.duckdb")
    cfg = _cfg(out)
    load_or_write_manifest(cfg, plan_shards(cfg))
    path = os.path.join(cfg.work_dir, "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    del manifest["plan"]["region_grid"]
    with open(path, "w") as f:
        json.dump(manifest, f)
    with pytest.raises(OptwinError, match=r"different build .the region grid differ"):
        build(_cfg(out, resume=True))
