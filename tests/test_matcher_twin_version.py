"""Fingerprints replayed by another twin version: still served, but the matcher says so once per load
(optwin.matcher log warning), exposes the versions, and the sidecar's /healthz and /metrics report them.

    python -m pytest -q tests/test_matcher_twin_version.py
"""

from __future__ import annotations

import json
import logging
import shutil

import duckdb
import pytest

from _matcher_fixture import cached_db
from optwin.fingerprints.client import HTTP
from optwin.fingerprints.matcher import Matcher
from optwin.fingerprints.sidecar import SidecarConfig, SidecarThread
from optwin.twin import TWIN_VERSION

TRIPLE = ("rmsnorm", "native-dtype", "float16")
OLD = "0"  # a version no optwin's twins had


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> str:
    return cached_db(str(tmp_path_factory.mktemp("fp") / "fp.duckdb"))


def _copy(pristine: str, path: str, *sql: str) -> str:
    shutil.copyfile(pristine, path)
    con = duckdb.connect(path)
    try:
        for q in sql:
            con.execute(q)
    finally:
        con.close()
    return path


def _twin_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "optwin.matcher" and r.levelno == logging.WARNING]


def test_current_twin_version_loads_without_a_word(pristine, tmp_path, caplog):
    path = _copy(pristine, str(tmp_path / "cur.duckdb"), f"UPDATE builds SET twin_version = '{TWIN_VERSION}'")
    with caplog.at_level(logging.WARNING, logger="optwin.matcher"):
        m = Matcher.open(path)
    assert m.twin_versions == {"fixture-0": TWIN_VERSION} and not m.twin_version_mismatch
    assert _twin_warnings(caplog) == []


def test_another_twin_version_is_served_and_said_once(pristine, tmp_path, caplog):
    cur = Matcher.open(_copy(pristine, str(tmp_path / "cur.duckdb"), f"UPDATE builds SET twin_version = '{TWIN_VERSION}'"))
    path = _copy(pristine, str(tmp_path / "old.duckdb"), f"UPDATE builds SET twin_version = '{OLD}'")
    with caplog.at_level(logging.WARNING, logger="optwin.matcher"):
        m = Matcher.open(path)
        for _ in range(3):  # per call: nothing more
            m.assess(*TRIPLE, sketch={"numel": 256.0, "rows": 4.0, "absmax": 600.0, "rms": 200.0, "nonfinite": 0.0,
                                      "hidden": 64.0, "max_row_rms": 250.0, "weight_absmax": 1.0})
    assert m.twin_versions == {"fixture-0": OLD} and m.twin_version_mismatch
    assert all(m.index[t].probs == cur.index[t].probs for t in cur.index)  # still evidence: served as before
    (msg,) = _twin_warnings(caplog)
    assert path in msg and f"build fixture-0 (twin version {OLD})" in msg and f"(twin version {TWIN_VERSION})" in msg


def test_a_partial_rebuild_mixes_versions_and_names_the_old_build(pristine, tmp_path, caplog):
    # `optwin build --ops`: a newer build of rmsnorm native-dtype with the current twins, the rest from the old one
    path = _copy(pristine, str(tmp_path / "mixed.duckdb"), f"UPDATE builds SET twin_version = '{OLD}'",
                 "INSERT INTO builds SELECT 'rms-only', created_at + INTERVAL 1 HOUR, code_version, "
                 f"'{TWIN_VERSION}', seed, flags, profile, replays, noise, engine, n_cases, n_replays, duration_s "
                 "FROM builds",
                 "INSERT INTO fingerprints SELECT 'rms-only', * EXCLUDE (build_id) FROM fingerprints "
                 "WHERE op = 'rmsnorm' AND variant = 'native-dtype'")
    with caplog.at_level(logging.WARNING, logger="optwin.matcher"):
        m = Matcher.open(path)
    assert m.builds[TRIPLE] == "rms-only"
    assert m.twin_versions == {"fixture-0": OLD, "rms-only": TWIN_VERSION} and m.twin_version_mismatch
    (msg,) = _twin_warnings(caplog)
    assert f"build fixture-0 (twin version {OLD})" in msg and "rms-only" not in msg
    # a build given by id serves that build alone: the current one, nothing to say
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="optwin.matcher"):
        one = Matcher.open(path, build_id="rms-only")
    assert one.twin_versions == {"rms-only": TWIN_VERSION} and not one.twin_version_mismatch
    assert _twin_warnings(caplog) == []


@pytest.mark.parametrize("version, mismatch", [(OLD, True), (TWIN_VERSION, False)])
def test_sidecar_healthz_and_metrics_report_the_twin_version(pristine, tmp_path, version, mismatch):
    path = _copy(pristine, str(tmp_path / "sc.duckdb"), f"UPDATE builds SET twin_version = '{version}'")
    with SidecarThread(path, config=SidecarConfig(max_lag_s=60.0)) as sc:
        http = HTTP(sc.url)
        code, data = http.request("GET", "/healthz")
        health = json.loads(data)
        assert code == 200 and health["build_id"] == "fixture-0"
        assert health["twin_versions"] == {"fixture-0": version} and health["twin_version_mismatch"] is mismatch
        code, text = http.request("GET", "/metrics")
        assert code == 200 and f"optwin_sidecar_twin_version_mismatch {int(mismatch)}" in text.decode()
