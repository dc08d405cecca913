"""The GPU side of `optwin validate` run on the CPU (standing in for the device): held-out inputs,
labels, drift traces, failure recording, the collect-only import boundary and the CLI halves.

    python -m pytest -q tests/test_validate_collect.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from optwin.catalog import CATALOG
from optwin.fingerprints.matcher import Matcher
from optwin.kernels.production import run_variant
from optwin.validate.cli import validate_command
from optwin.validate.collect import collect, collect_traces, run_call
from optwin.validate.drift import TRACES, trace_inputs, trace_spec
from optwin.validate.families import HELD_OUT_FAMILIES, held_out_case, held_out_cases
from optwin.validation import validate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _cpu_without_triton_interpreter(monkeypatch):
    """The kernel tests set TRITON_INTERPRET=1 for the whole process; here the CPU stands in for a
    device without Triton, as on a CPU machine, so the variant set is the production one."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.mark.parametrize("op", list(CATALOG))
def test_held_out_cases_are_valid_seeded_and_cycle_families(op):
    for dtype in CATALOG[op].dtypes:
        cases = held_out_cases(op, dtype, 4, seed=3)
        assert [c.family for c in cases] == [HELD_OUT_FAMILIES[i % 3] for i in range(4)]
        for c in cases:
            validate(op, CATALOG[op].variant_names[0], dtype, c.inputs, values=False)
            finite = [t for t in c.inputs.values() if t.is_floating_point()]
            assert all(bool(torch.isnan(t).logical_not().all()) for t in finite)
            assert any(bool((t != 0).any()) for t in finite)  # never all zeros
        again = held_out_case(op, dtype, 1, seed=3)
        other = held_out_case(op, dtype, 1, seed=4)
        for k, t in cases[1].inputs.items():
            assert torch.equal(t, again.inputs[k])
        assert any(t.shape != other.inputs[k].shape or not torch.equal(t, other.inputs[k])
                   for k, t in cases[1].inputs.items())


def test_labels_follow_the_spec_on_known_inputs():
    # naive float16 softmax: exp(20) overflows float16 -> inf/inf = NaN (nonfinite); torch's is fine
    x = (torch.linspace(-1, 0, 64) + 20.0).reshape(2, 32).half()
    sk, out = run_call("softmax", "float16", ["torch", "naive"], {"x": x}, {}, "cpu", set())
    assert sk["max"] == pytest.approx(20.0)
    assert out["naive"]["labels"]["nonfinite"] is True
    assert out["torch"]["labels"] == {"nonfinite": False, "precision_loss": False, "low_entropy": False}
    # native-dtype rmsnorm float16: x*x overflows past |x| = 256 -> rsqrt(inf) = 0 -> output 0
    x = torch.full((2, 64), 300.0).half()
    w = torch.ones(64).half()
    _, out = run_call("rmsnorm", "float16", ["fp32-acc", "native-dtype"], {"x": x, "weight": w}, {}, "cpu", set())
    assert out["native-dtype"]["labels"]["precision_loss"] is True
    assert not any(out["fp32-acc"]["labels"].values())
    assert out["fp32-acc"]["rel_error"] < 16 * 2.0**-11


def test_collect_cases_on_cpu_records_everything():
    data = collect("cpu", 6, seed=0, ops=["softmax", "geodesic"], traces=False, progress=lambda m: None)
    assert data["format"] == "optwin-validate-collect" and data["device"] == "cpu"
    assert len(data["cases"]) == 6 * 3 + 6  # softmax in 3 dtypes, geodesic float32
    for c in data["cases"]:
        assert set(c["outcomes"]) == set(CATALOG[c["op"]].variant_names) - {"triton"}
        assert c["family"] in HELD_OUT_FAMILIES and c["seed"] == 10**6
        for o in c["outcomes"].values():
            assert set(o["labels"]) == set(CATALOG[c["op"]].fault_types)
    # the stored labels are those of the variant output on the stored inputs
    c = data["cases"][4]
    case = held_out_case(c["op"], c["dtype"], c["case"], seed=0)
    y = run_variant(c["op"], "naive", c["dtype"], case.inputs, case.params)
    assert bool((~torch.isfinite(y)).any()) == c["outcomes"]["naive"]["labels"]["nonfinite"]
    json.dumps(data, allow_nan=False)


def test_broken_variant_is_recorded_and_abandoned():
    # Triton kernels refuse CPU tensors (without TRITON_INTERPRET): a real per-triple failure.
    data = collect("cpu", 5, seed=0, ops=["rmsnorm"], include_triton=True, traces=False, progress=lambda m: None)
    fails = [f for f in data["failures"] if f["variant"] == "triton"]
    assert len(fails) == 3 * 3  # abandoned after 3 consecutive failures, in each of 3 dtypes
    assert all(f["error"] for f in fails)
    assert all("labels" in c["outcomes"]["native-dtype"] for c in data["cases"])


def test_time_budget_skips_groups_and_checkpoints_keep_partial_results(tmp_path):
    ckpt = tmp_path / "partial.json"
    data = collect("cpu", 3, seed=0, ops=["geodesic", "matmul"], trace_calls=3, progress=lambda m: None,
                   max_seconds=1e-3, checkpoint=ckpt)
    assert data["cases"] == [] and not data["partial"]
    skipped = [f for f in data["failures"] if f["error"] == "skipped: time budget spent"]
    assert [(f["op"], f["dtype"]) for f in skipped] == [("geodesic", "float32"), ("matmul", "float16"),
                                                         ("matmul", "bfloat16"), ("matmul", "float32")]
    assert len(data["traces"]) == 2  # the traces run first, inside any budget
    saved = json.loads(ckpt.read_text())
    assert saved["partial"] is True and len(saved["traces"]) == 2
    # without a budget every group is checkpointed as it finishes
    data = collect("cpu", 2, seed=0, ops=["matmul"], traces=False, progress=lambda m: None, checkpoint=ckpt)
    assert len(json.loads(ckpt.read_text())["cases"]) == len(data["cases"]) == 2 * 3


def test_drift_traces_reach_faults_and_flat_controls_do_not():
    traces, failures = collect_traces("cpu", 0, include_triton=False, progress=lambda m: None)
    assert not failures
    by = {(t["name"], t["kind"]): t for t in traces}
    assert set(by) == {(s.name, k) for s in TRACES for k in ("drift", "flat")}

    def first_fault(t, v):
        return next((c["t"] for c in t["calls"] if any(c["outcomes"][v]["labels"].values())), None)

    # |x| crosses 256 at u = log(64)/log(1000) = 0.602 -> call 120 of 200 -> t = 6.0 s at 20 calls/s
    assert 5.5 <= first_fault(by[("rmsnorm-activations", "drift")], "native-dtype") <= 6.5
    assert first_fault(by[("rmsnorm-activations", "drift")], "fp32-acc") is None
    # max logit crosses 11.09 at u = log(11.09)/log(40) = 0.653 -> t ~ 6.5 s (row noise shifts it a bit)
    assert 4.0 <= first_fault(by[("softmax-logits", "drift")], "naive") <= 7.0
    assert first_fault(by[("geodesic-converging", "drift")], "acos") is not None
    for spec in TRACES:
        flat = by[(spec.name, "flat")]
        assert all(first_fault(flat, v) is None for v in flat["variants"])
        times = [c["t"] for c in flat["calls"]]
        assert times[:3] == [0.0, 0.05, 0.1]  # 20 calls/s


def test_trace_inputs_are_deterministic():
    spec = trace_spec("rope-positions")
    a, b = trace_inputs(spec, "drift", 0, 5), trace_inputs(spec, "drift", 0, 5)
    assert all(torch.equal(x[0]["x"], y[0]["x"]) for x, y in zip(a, b))
    assert a[-1][0]["positions"][0] == 2**22  # the last call sits at the end of the drift


_IMPORT_CHECK = r"""
import json, sys
from optwin.validate.cli import validate_command
validate_command(db=None, device="cpu", cases=2, json_out=None, collect_only=sys.argv[1], labels=None, seed=0,
                 ops=["rmsnorm", "geodesic"], no_triton=True, trace_calls=4, threshold=None, forecast="default",
                 max_seconds=None)
heavy = sorted(m for m in ("duckdb", "polars", "scipy", "pyarrow", "streamlit", "ray") if m in sys.modules)
print(json.dumps(heavy))
"""


def test_collect_only_imports_no_heavy_modules(tmp_path):
    out = tmp_path / "gpu.json"
    r = subprocess.run([sys.executable, "-c", _IMPORT_CHECK, str(out)], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
    data = json.loads(out.read_text())
    assert len(data["cases"]) == 2 * 3 + 2 and len(data["traces"]) == 4  # rmsnorm + geodesic traces, 2 kinds
    assert "collected" in r.stderr  # progress went to stderr


_TORCH_ONLY = r"""
import json, runpy, sys
import torch


def third_party():
    return {m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names) - {"__main__", "__mp_main__"}
before = third_party()
sys.argv = ["collect", "--device", "cpu", "--cases", "2", "--ops", "matmul,geodesic", "--out", sys.argv[1]]
try:
    runpy.run_module("optwin.validate.collect", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print(json.dumps(sorted(third_party() - before)))
"""


def test_argparse_entry_point_needs_only_torch_and_numpy(tmp_path):
    # The GPU machine has torch and numpy only: the stand-alone entry point loads nothing else
    # beyond what `import torch` itself loads.
    out = tmp_path / "gpu.json"
    r = subprocess.run([sys.executable, "-c", _TORCH_ONLY, str(out)], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout.strip().splitlines()[-1])) <= {"optwin", "numpy"}
    data = json.loads(out.read_text())
    assert len(data["cases"]) == 2 * 3 + 2 and len(data["traces"]) == 2  # geodesic drift + flat


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("validate")(validate_command)
    app.command("noop")(lambda: None)  # two commands: `validate` stays a subcommand
    return app


def test_cli_collect_then_score_halves(tmp_path):
    from optwin.fingerprints.regions import region_key, region_of

    gpu = tmp_path / "gpu.json"
    runner = CliRunner()
    r = runner.invoke(_app(), ["validate", "--collect-only", str(gpu), "--device", "cpu", "--cases", "6", "--ops",
                               "softmax", "--trace-calls", "40"])
    assert r.exit_code == 0, r.output
    data = json.loads(gpu.read_text())
    # A real Matcher over fingerprints that flag every region where naive float16 softmax faulted.
    flagged: dict[tuple[str, str], float] = {}
    for c in data["cases"]:
        if c["dtype"] == "float16":
            for ft, y in c["outcomes"]["naive"]["labels"].items():
                key = (region_key(region_of("softmax", c["sketch"])), ft)
                flagged[key] = max(flagged.get(key, 0.0), float(y))
    rows = [{"op": "softmax", "variant": "naive", "dtype": "float16", "region": reg, "fault_type": ft,
             "probability": p} for (reg, ft), p in flagged.items()]
    from optwin.validate.score import score_collection

    rep = score_collection(data, Matcher.from_rows(rows))
    naive16 = next(x for x in rep["cases"] if (x["variant"], x["dtype"]) == ("naive", "float16"))
    assert naive16["n"] == 6 and naive16["warn"]["fn"] == 0  # every fault it has seen is warned
    assert {t["trace"] for t in rep["traces"]} == {"softmax-logits"}


def test_cli_errors_are_one_line(tmp_path):
    from optwin.errors import OptwinError

    runner = CliRunner()
    r = runner.invoke(_app(), ["validate", "--device", "cpu"])
    assert isinstance(r.exception, OptwinError) and "--db is required" in str(r.exception)
    r = runner.invoke(_app(), ["validate", "--db", str(tmp_path / "nope.duckdb"), "--device", "cpu"])
    assert isinstance(r.exception, OptwinError) and "no fingerprint database" in str(r.exception)
    r = runner.invoke(_app(), ["validate", "--collect-only", str(tmp_path / "x.json"), "--labels", "y", "--device", "cpu"])
    assert isinstance(r.exception, OptwinError) and "two halves" in str(r.exception)
    if not torch.cuda.is_available():
        r = runner.invoke(_app(), ["validate", "--collect-only", str(tmp_path / "x.json"), "--device", "cuda"])
        assert isinstance(r.exception, OptwinError) and "not available" in str(r.exception)
    r = runner.invoke(_app(), ["validate", "--collect-only", str(tmp_path / "x.json"), "--device", "cpu", "--ops", "conv"])
    assert isinstance(r.exception, OptwinError) and "unknown operator" in str(r.exception)
