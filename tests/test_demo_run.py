"""`optwin demo --fast` end to end on the CPU: quick build, drifting float16 model, warnings with lead time.

    python -m pytest -q tests/test_demo_run.py
"""

from __future__ import annotations

import json

import pytest
import torch
import typer
from typer.testing import CliRunner

from optwin.demo import DemoConfig, demo_command, make_model, norm_modules
from optwin.kernels.production import run_variant


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("demo")(demo_command)
    app.command("noop")(lambda: None)  # two commands: `demo` stays a subcommand
    return app


def test_demo_norm_is_the_native_dtype_variant():
    model = make_model(DemoConfig.fast())
    names = [n for n, _ in norm_modules(model)]
    assert names == ["layers.0.norm", "norm"]
    mod = dict(norm_modules(model))["norm"]
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 5, 64, generator=g) * 40).half()  # (B, S, H)
    with torch.no_grad():
        y = mod(x)
    ref = run_variant("rmsnorm", "native-dtype", "float16", {"x": x, "weight": mod.weight.detach()})
    assert y.dtype == torch.float16 and torch.equal(y, ref)


def test_demo_fast_warns_before_the_first_real_fault(tmp_path):
    runner = CliRunner()
    r = runner.invoke(_app(), ["demo", "--fast", "--workdir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "WARNING" in out and "FAULT" in out
    assert f"optwin dashboard --db {tmp_path}" in out.replace("\n", "")
    report = json.loads((tmp_path / "demo_report.json").read_text())
    streams = [s for s in report["streams"] if not s["control"]]
    control = [s for s in report["streams"] if s["control"]]
    assert [s["name"] for s in streams] == ["drift.layers.0.norm", "drift.norm"]
    assert [s["name"] for s in control] == ["control.layers.0.norm", "control.norm"]
    assert all(s["calls"] == report["steps"] for s in streams + control)
    assert any(s["first_fault_t"] is not None for s in streams)  # the drift really reaches faults
    assert all(s["first_fault_t"] is None for s in control)  # the same model without drift never faults
    assert report["false_alarms"] == sum(s["warned_calls"] for s in control)
    early = [s for s in streams if s["lead_s"] is not None and s["lead_s"] > 0]
    assert early, streams
    assert report["early_warnings"] == len(early)
    for s in early:
        assert s["first_warn_t"] < s["first_fault_t"]
        assert s["lead_s"] == pytest.approx(s["first_fault_t"] - s["first_warn_t"])
    # before the drift the embeddings are N(0, 1): the first calls are not faults
    assert all(s["first_fault_step"] is None or s["first_fault_step"] > 20 for s in streams)

    # a second run reuses the database instead of rebuilding
    r2 = runner.invoke(_app(), ["demo", "--fast", "--workdir", str(tmp_path), "--steps", "30"])
    assert r2.exit_code == 0, r2.output
    assert "using the fingerprint database" in r2.output
    assert json.loads((tmp_path / "demo_report.json").read_text())["build_s"] == 0.0
