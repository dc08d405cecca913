"""`optwin validate` in one process on a real quick-built DuckDB database (CPU standing in for the GPU).

    python -m pytest -q tests/test_validate_end_to_end.py
"""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from optwin.fingerprints.build import BuildConfig, build
from optwin.validate.cli import validate_command


@pytest.fixture(autouse=True)
def _cpu_without_triton_interpreter(monkeypatch):
    """The kernel tests set TRITON_INTERPRET=1 for the whole process; here the CPU stands in for a
    device without Triton, as on a CPU machine, so the variant set is the production one."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)



@pytest.fixture(scope="module")
def rmsnorm_db(tmp_path_factory):
    out = tmp_path_factory.mktemp("db") / "fp.duckdb"
    build(BuildConfig(out=str(out), ops=("rmsnorm",), quick=True, cases=12, replays=4, include_triton=False, seed=0,
                      workers=2))
    return out


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("validate")(validate_command)
    app.command("noop")(lambda: None)
    return app


def test_validate_scores_against_a_real_database(rmsnorm_db, tmp_path):
    report_path = tmp_path / "report.json"
    r = CliRunner().invoke(_app(), ["validate", "--db", str(rmsnorm_db), "--device", "cpu", "--cases", "30", "--ops",
                                    "rmsnorm", "--trace-calls", "200", "--json", str(report_path)])
    assert r.exit_code == 0, r.output
    assert "held-out cases vs matcher" in r.output and "drift traces" in r.output
    rep = json.loads(report_path.read_text())
    assert rep["build_id"] and rep["collection"]["device"] == "cpu"
    rows = {(x["variant"], x["dtype"]): x for x in rep["cases"]}
    assert set(rows) == {(v, d) for v in ("fp32-acc", "native-dtype") for d in ("float16", "bfloat16", "float32")}
    for x in rows.values():
        assert x["n"] == 30 and 0.0 <= x["brier"] <= 1.0
        for f in x["faults"].values():
            assert f["auroc"] is None or 0.0 <= f["auroc"] <= 1.0
    native16 = rows[("native-dtype", "float16")]
    assert native16["positives"] > 0 and native16["faults"]["precision_loss"]["positives"] > 0
    # the drift into fp16 x*x overflow: native-dtype faults on the drift trace, never on the flat one
    tr = {(t["kind"], t["variant"]): t for t in rep["traces"]}
    assert tr[("drift", "native-dtype")]["first_fault_t"] is not None
    assert tr[("flat", "native-dtype")]["first_fault_t"] is None
    assert rep["summary"]["faulting_streams"] >= 1 and rep["summary"]["flat_streams"] == 2  # fp32-acc and native-dtype


def test_validate_labels_half_reads_collect_only_output(rmsnorm_db, tmp_path):
    gpu = tmp_path / "gpu.json"
    runner = CliRunner()
    r = runner.invoke(_app(), ["validate", "--collect-only", str(gpu), "--device", "cpu", "--cases", "5", "--ops",
                               "rmsnorm", "--trace-calls", "0"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(_app(), ["validate", "--labels", str(gpu), "--db", str(rmsnorm_db), "--json",
                               str(tmp_path / "rep.json")])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "rep.json").read_text())
    assert sum(x["n"] for x in rep["cases"]) == 5 * 3 * 2 and rep["traces"] == []
