"""A filesystem that cannot fsync a directory does not fail the shards.

    python -m pytest -q tests/test_shard_dir_fsync_unsupported.py

On FUSE and some network filesystems (where Ray work directories may live) fsync of a directory raises EINVAL or
ENOTSUP after the rename already happened: every shard failed over it.
"""

from __future__ import annotations

import errno
import os
import stat

import pytest

from optwin.fingerprints import shards
from optwin.fingerprints.build import BuildConfig, plan_shards
from optwin.fingerprints.shards import run_shard, shard_done

ARGS = dict(ops=("geodesic",), cases=4, replays=1, seed=7, workers=1)


def _refusing_dir_fsync(code: int):
    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)
    return fsync


@pytest.mark.parametrize("code", [errno.EINVAL, errno.EOPNOTSUPP])
def test_shard_is_written_when_the_directory_fsync_is_unsupported(tmp_path, monkeypatch, code):
    monkeypatch.setattr(shards.os, "fsync", _refusing_dir_fsync(code))
    spec = plan_shards(BuildConfig(**ARGS))[0]
    summary = run_shard(spec.to_dict(), str(tmp_path))
    assert summary["shard"] == spec.shard_id and shard_done(str(tmp_path), spec.shard_id)


def test_other_directory_fsync_errors_still_fail(tmp_path, monkeypatch):
    monkeypatch.setattr(shards.os, "fsync", _refusing_dir_fsync(errno.EIO))  # a real I/O error is not swallowed
    spec = plan_shards(BuildConfig(**ARGS))[0]
    with pytest.raises(OSError) as e:
        run_shard(spec.to_dict(), str(tmp_path))
    assert e.value.errno == errno.EIO
