"""Bad input to `optwin build`: one clear `error:` line, non-zero exit, nothing half-written.

    python -m pytest -q tests/test_build_errors.py
"""

from __future__ import annotations

import json
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
from _procs import alive, children, wait_for

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
    for cfg in (dict(noise="loud"), dict(engine="spark"), dict(replays=-1), dict(tolerances={"ulps": 8}),
                dict(tolerances={"precision_loss_ulps": -1.0})):  # tolerances: the twin's own check, up front
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


@pytest.mark.parametrize("args,msg", [
    (["build", "--replays", "abc"], "error: Invalid value for '--replays'"),
    (["build", "--workers", "0", "--ops", "geodesic"], "error: --replays must be >= 0, --cases and --workers >= 1"),
    (["build", "--ops", "geodesic", "--cases", "2", "--out", "/proc/optwin.duckdb"], "error: "),  # the OS refuses
    (["migrate"], "error: Missing argument 'db'"),
    (["bogus"], "error: No such command 'bogus'"),
])
def test_usage_errors_and_refused_paths_are_one_error_line(tmp_path, args, msg):
    r = _cli(args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = r.stderr.strip()
    assert err.splitlines() == [err] and err.startswith(msg), r.stderr
    assert "Traceback" not in r.stderr


def test_a_second_build_of_the_same_database_is_refused_and_touches_nothing(tmp_path):
    from optwin.fingerprints.build_lock import build_lock

    out = str(tmp_path / "fp.duckdb")
    work = tmp_path / "fp.duckdb.work"
    work.mkdir()
    (work / "theirs").write_text("a running build's shard")
    with build_lock(out):  # the first build, still running
        r = _cli(["build", "--ops", "geodesic", "--cases", "2", "--out", out])
        assert r.returncode == 2 and f"another build (pid {os.getpid()}) is writing it" in r.stderr, r.stderr
        assert (work / "theirs").exists()  # the second build cleared nothing
    assert not os.path.exists(out + ".lock")
    with build_lock(out):  # released: the next one takes it
        pass


def test_pool_workers_exit_when_their_builder_is_killed(tmp_path):
    # kill -9 reaches no shutdown code: the workers must notice on their own that their parent is gone
    code = ("import os, time, multiprocessing as mp\n"
            "from concurrent.futures import ProcessPoolExecutor\n"
            "from optwin.fingerprints.engines import _init_worker\n"
            "if __name__ == '__main__':\n"
            "    ex = ProcessPoolExecutor(2, mp_context=mp.get_context('spawn'), initializer=_init_worker,\n"
            "                             initargs=(os.getpid(),))\n"
            "    [f.result() for f in [ex.submit(time.sleep, 0.01) for _ in range(4)]]\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(600)\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        workers = children(p.pid)
        assert len(workers) >= 2, workers  # the pool's workers (and spawn's resource tracker)
        p.kill()
        p.wait(10)
        assert wait_for(lambda: not any(alive(w) for w in workers), 10.0), [w for w in workers if alive(w)]
    finally:
        if p.poll() is None:
            p.kill()


def test_sigterm_stops_a_build_like_ctrl_c(tmp_path):
    out = str(tmp_path / "fp.duckdb")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-m", "optwin.fingerprints.cli", "build", "--ops", "layernorm", "--cases",
                          "64", "--workers", "2", "--out", out], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(children(p.pid)) >= 2 or p.poll() is not None, 120.0)
        assert p.poll() is None, p.communicate()
        workers = children(p.pid)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "interrupted:" in err and "--resume" in err
    assert wait_for(lambda: not any(alive(w) for w in workers), 10.0)
    assert not os.path.exists(out) and not os.path.exists(out + ".lock")


# A gather as long as a big build's: add_build first runs a long query on the store's connection, and the signal
# comes while DuckDB runs it (DuckDB then fails the query with RuntimeError("Query interrupted"), not a
# duckdb.Error). One DuckDB thread: with several, DuckDB 2.0 may not look at the signal until the query ends.
_SLOW_GATHER = """
import os, signal, sys, threading
from optwin.fingerprints import duckdb_store
sig, orig = getattr(signal, sys.argv[1]), duckdb_store.DuckDBStore.add_build
def slow(self, build, files):
    self.conn.execute("SET threads = 1")
    threading.Timer(0.5, os.kill, (os.getpid(), sig)).start()
    self.conn.execute("SELECT count(*) FROM range(100000000000) r(i) WHERE i % 7 = 3").fetchall()
    return orig(self, build, files)
duckdb_store.DuckDBStore.add_build = slow
from optwin.fingerprints.cli import _standalone
sys.argv = ["optwin", "build", *sys.argv[2:]]
_standalone()
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_interrupt_during_the_gather_is_the_interrupt_path_and_leaves_the_database(tmp_path, sig):
    """Ctrl-C or SIGTERM while DuckDB gathers the shards into the database reaches us as DuckDB's
    RuntimeError("Query interrupted"): it must take the interrupt path (the --resume hint, exit 130, no traceback),
    leave the existing database byte for byte and no temporary copy, and keep the finished shards for --resume."""
    out = str(tmp_path / "fp.duckdb")
    args = ["--ops", "geodesic", "--cases", "2", "--replays", "1", "--workers", "1", "--out", out]
    assert _cli(["build", *args, "--seed", "1"]).returncode == 0
    before = open(out, "rb").read()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _SLOW_GATHER, sig, *args, "--seed", "2"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 130, r.stderr
    assert "Traceback" not in r.stderr and "interrupted:" in r.stderr and "--resume" in r.stderr, r.stderr
    assert open(out, "rb").read() == before
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p or p.endswith(".lock")]
    assert os.listdir(os.path.join(out + ".work", "shards"))
    r = _cli(["build", *args, "--seed", "2", "--resume"])
    assert r.returncode == 0, r.stderr
    with duckdb.connect(out, read_only=True) as c:
        assert c.execute("SELECT count(*) FROM builds").fetchall() == [(2,)]


@pytest.mark.parametrize("kind", ["empty", "parent-is-a-file", "directory"])
def test_an_unwritable_out_is_refused_before_any_work(tmp_path, kind):
    """A --out the build cannot write (empty, under a file, a directory) is one `error:` line from the up-front
    checks, not a failure after all the shards ran: no work directory, lock or copy appears (the command runs in
    tmp_path, where `--out ""` would put `.work`). check_out's permission checks (a read-only directory or file)
    are not tested here: CI runs as root, which writes through file permissions, and a test skipped there for
    good would assert nothing."""
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "fp.duckdb").write_bytes(b"")
    out = {"empty": "", "parent-is-a-file": str(blocker / "sub" / "fp.duckdb"), "directory": str(ro)}[kind]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "optwin.fingerprints.cli", "build", "--ops", "geodesic", "--cases", "2",
                        "--replays", "1", "--workers", "1", "--out", out], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    err = r.stderr.strip()
    assert r.returncode == 2 and err.splitlines() == [err] and err.startswith("error: --out"), r.stderr
    assert sorted(os.listdir(tmp_path)) == ["afile", "ro"] and os.listdir(ro) == ["fp.duckdb"]


@pytest.mark.parametrize("ops", ["", ",", " , "])
def test_ops_naming_no_operator_is_refused_not_read_as_all(tmp_path, ops):
    """`--ops ""` (an unset shell variable, say) names no operator: one `error:` line, not a build of every
    operator (leaving --ops out is how to ask for all)."""
    out = tmp_path / "fp.duckdb"
    r = _cli(["build", "--ops", ops, "--cases", "1", "--replays", "0", "--out", str(out)])
    err = r.stderr.strip()
    assert r.returncode == 2 and err.splitlines() == [err], r.stderr
    assert err.startswith("error: --ops names no operator") and "leave --ops out" in err
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_profile_with_non_finite_sketches_is_refused_up_front_naming_file_and_column(tmp_path, bad):
    """Sketch features are finite by construction, so NaN/inf in a profile's sketch table means a damaged file.
    The up-front checks refuse it with one line naming the profile, the op and the column, before any shard runs
    (it used to pass them and fail mid-build fitting the sketches, naming neither)."""
    import polars as pl
    import torch

    from optwin.ingest.capture import capture

    norm = torch.nn.RMSNorm(16).half()
    with torch.no_grad(), capture(norm, sample_rate=1.0, capacity=2, seed=1, ops=("rmsnorm",)) as rec:
        for _ in range(3):
            norm(torch.randn(4, 16, dtype=torch.float16))
    prof = rec.write_profile(tmp_path / "prof", model="tiny-rmsnorm")
    sketches = pl.read_parquet(prof / "sketches.parquet")
    sketches.with_columns(pl.lit(bad, dtype=pl.Float64).alias("rms")).write_parquet(prof / "sketches.parquet")
    # as a profile written before optwin kept checksums (read unverified): the checksum would refuse this file
    # first, and the NaN check is what stands for old profiles and writers other than optwin's
    meta = json.loads((prof / "profile.json").read_text())
    del meta["checksums"]
    (prof / "profile.json").write_text(json.dumps(meta))
    with pytest.raises(ProfileError) as e:
        build(BuildConfig(out=str(tmp_path / "fp.duckdb"), profile=str(prof), ops=("rmsnorm",), cases=2, replays=1,
                          workers=1))
    msg = str(e.value)
    assert "\n" not in msg and str(prof) in msg and "'rms'" in msg and "rmsnorm" in msg, msg
    assert not _leftovers(tmp_path) and not (tmp_path / "fp.duckdb").exists()
    build(BuildConfig(out=str(tmp_path / "fp.duckdb"), profile=str(prof), ops=("geodesic",), cases=2, replays=1,
                      workers=1))  # a build that uses none of the profile's ops does not read those sketches
