"""The Ray engine runs the same shard function on a local Ray cluster and yields the same database rows.

    python -m pytest -q tests/test_build_ray.py
"""

from __future__ import annotations

import duckdb

from optwin.fingerprints.build import BuildConfig, build

SMALL = dict(ops=("geodesic", "matmul"), cases=6, replays=3, seed=9, workers=2)


def _rows(path: str) -> tuple[list[tuple], list[tuple]]:
    with duckdb.connect(path, read_only=True) as c:
        fps = c.execute("SELECT * EXCLUDE (build_id) FROM fingerprints ORDER BY ALL").fetchall()
        eng = c.execute("SELECT engine, json_extract_string(flags, '$.engine') FROM builds").fetchall()
    return fps, eng


def test_ray_build_equals_local_build(tmp_path):
    import ray

    ray_out, local_out = str(tmp_path / "ray.duckdb"), str(tmp_path / "local.duckdb")
    progress: list[str] = []
    res = build(BuildConfig(out=ray_out, engine="ray", **SMALL), on_shard=lambda s: progress.append(s["shard"]))
    assert not ray.is_initialized(), "the local cluster the build started is shut down"
    assert res.shards_run == len(progress) == len(set(progress)) > 0
    build(BuildConfig(out=local_out, engine="local", **SMALL))
    ray_fps, ray_engine = _rows(ray_out)
    local_fps, local_engine = _rows(local_out)
    assert ray_fps == local_fps and len(ray_fps) > 0
    assert ray_engine == [("ray", "ray")] and local_engine == [("local", "local")]
