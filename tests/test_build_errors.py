"""Bad input to `optwin build`: one clear `error:` line, non-zero exit, nothing half-written.

    python -m pytest -q tests/test_build_errors.py
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys

import duckdb
import pytest

from optwin.errors import CatalogError, DatabaseError, ProfileError, SchemaVersionError
from optwin.fingerprints.build import BuildConfig, build
from optwin.fingerprints.store import open_store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(args: list[str], preexec=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "optwin.fingerprints.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, preexec_fn=preexec)


def _leftovers(d) -> list[str]:
    return [p for p in os.listdir(d) if ".tmp-" in p or p.endswith(".work")]


def test_unknown_op_is_one_error_line_and_writes_nothing(tmp_path):
    out = tmp_path / "fp.duckdb"
    r = _cli(["build", "--ops", "foo", "--out", str(out)])
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert lines == [lines[-1]] and lines[0].startswith("error: unknown operator 'foo'"), r.stderr
    assert not out.exists() and not _leftovers(tmp_path)


@pytest.mark.parametrize("kind", ["missing", "corrupt"])
def test_bad_profile_is_a_profile_error(tmp_path, kind):
    prof = tmp_path / "prof"
    if kind == "corrupt":
        prof.mkdir()
        (prof / "profile.json").write_text("{not json")
    with pytest.raises(ProfileError) as e:
        build(BuildConfig(out=str(tmp_path / "fp.duckdb"), profile=str(prof), ops=("geodesic",), cases=2))
    assert "\n" not in str(e.value) and str(prof) in str(e.value)
    assert not _leftovers(tmp_path) and not (tmp_path / "fp.duckdb").exists()


def test_other_schema_version_refused_before_any_work(tmp_path):
    out = str(tmp_path / "fp.duckdb")
    open_store(out, read_only=False, create=True).close()
    with duckdb.connect(out) as c:
        c.execute("UPDATE schema_meta SET value = '99'")  # newer than this optwin
    before = open(out, "rb").read()
    r = _cli(["build", "--ops", "geodesic", "--cases", "2", "--out", out])
    assert r.returncode != 0 and r.stderr.strip().startswith("error:") and "optwin migrate" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert open(out, "rb").read() == before and not _leftovers(tmp_path)
    with pytest.raises(SchemaVersionError):
        build(BuildConfig(out=out, ops=("geodesic",), cases=2))


def test_bad_options_are_rejected(tmp_path):
    for cfg in (dict(noise="loud"), dict(engine="spark"), dict(replays=-1)):
        with pytest.raises((CatalogError, DatabaseError, Exception)) as e:
            build(BuildConfig(out=str(tmp_path / "x.duckdb"), ops=("geodesic",), cases=2, **cfg))
        assert type(e.value).__module__ == "optwin.errors"
    assert not os.listdir(tmp_path)


def _small_files() -> None:
    # A real "disk full" for this process tree: writes past 64 KiB fail (EFBIG) instead of killing it.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))


def test_full_disk_is_one_line_and_leaves_no_database(tmp_path):
    out = tmp_path / "fp.duckdb"
    r = _cli(["build", "--ops", "geodesic", "--cases", "4", "--replays", "2", "--workers", "1", "--out", str(out)],
             preexec=_small_files)
    assert r.returncode != 0, r.stdout
    err = r.stderr.strip().splitlines()
    assert err[-1].startswith("error:") and "disk full" in err[-1] and "--resume" in err[-1], r.stderr
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
