"""`optwin validate --labels FILE --ops OP` scores only OP's cases and traces.

    python -m pytest -q tests/test_s48_validate_ops.py

--ops went only to the collecting half: with --labels every case and drift trace in the file was scored, and
operators the database lacks came in at AUROC 0.5 with no warnings, so the pooled warn recall said nothing about
the operator asked for. Here a real CPU collection of rmsnorm and geodesic (cases and drift traces) is scored
against a real quick-built database of rmsnorm alone.
"""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from optwin.errors import CatalogError
from optwin.fingerprints.build import BuildConfig, build
from optwin.validate.cli import validate_command


@pytest.fixture(autouse=True)
def _cpu_without_triton_interpreter(monkeypatch):
    # Kernel tests set TRITON_INTERPRET=1 for the process; the CPU here stands in for a device without Triton.
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("s48")
    db = d / "fp.duckdb"
    build(BuildConfig(out=str(db), ops=("rmsnorm",), quick=True, cases=8, replays=2, include_triton=False, seed=0,
                      workers=2))
    labels = d / "gpu.json"
    r = CliRunner().invoke(_app(), ["validate", "--collect-only", str(labels), "--device", "cpu", "--cases", "3",
                                    "--ops", "rmsnorm,geodesic", "--trace-calls", "30", "--no-triton"])
    assert r.exit_code == 0, r.output
    data = json.loads(labels.read_text())
    # the file really holds both operators, cases and traces: else the test below proves nothing
    assert {c["op"] for c in data["cases"]} == {t["op"] for t in data["traces"]} == {"rmsnorm", "geodesic"}
    return db, labels


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("validate")(validate_command)
    app.command("noop")(lambda: None)
    return app


def _score(db, labels, out, *ops: str):
    return CliRunner().invoke(_app(), ["validate", "--labels", str(labels), "--db", str(db), "--json", str(out), *ops])


def test_labels_scored_for_the_asked_ops_only(files, tmp_path):
    db, labels = files
    r = _score(db, labels, tmp_path / "one.json", "--ops", "rmsnorm")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "one.json").read_text())
    assert {x["op"] for x in rep["cases"]} == {"rmsnorm"}
    assert rep["traces"] and {t["op"] for t in rep["traces"]} == {"rmsnorm"}
    assert rep["ops"] == ["rmsnorm"] and "scored ops: rmsnorm\n" in r.output
    assert rep["summary"]["triples"] == 6  # fp32-acc, native-dtype x 3 dtypes: no geodesic rows pooled in

    # without --ops the whole file is scored, as before
    r = _score(db, labels, tmp_path / "all.json")
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "all.json").read_text())
    assert {x["op"] for x in rep["cases"]} == {t["op"] for t in rep["traces"]} == {"rmsnorm", "geodesic"}
    assert rep["ops"] == ["rmsnorm", "geodesic"]


def test_an_asked_op_the_labels_lack_is_refused(files, tmp_path):
    db, labels = files
    r = _score(db, labels, tmp_path / "x.json", "--ops", "rmsnorm,softmax")
    assert isinstance(r.exception, CatalogError), r.output
    msg = str(r.exception)
    assert "\n" not in msg and msg.startswith("--ops softmax: ") and "holds no case or trace" in msg
    assert not (tmp_path / "x.json").exists()
