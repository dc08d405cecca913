"""Zero and near-zero inputs, common at init, on a REAL build: no false warning, while a real fault next to them
still warns.

A PEFT LoRA's B starts at zero (every call of the adapter is an fp16 matmul with a zero operand), a fresh router's
logits are near zero, and so on. Such a sketch bins far below anything the ordinary sweep cases reach (out_bound 0 is
bin 0, 1e-9 is bin ~240), so the matcher used to answer from the nearest cells it had: fp16 subnormal products
(precision_loss 1.0) and masked softmax rows (nonfinite 0.3-0.5), though the twins find no fault. The sweeps now
replay such inputs (optwin.ingest.generate._tiny_case).

    python -m pytest -q tests/test_matcher_zero_inputs.py
"""

from __future__ import annotations

import pytest
import torch

from optwin import twin
from optwin.fingerprints.matcher import Matcher
from optwin.ingest import boundary_sweep, default_sweep, sketch

F16 = torch.float16


@pytest.fixture(scope="module")
def m(tmp_path_factory) -> Matcher:
    from optwin.fingerprints.build import BuildConfig, build

    out = str(tmp_path_factory.mktemp("zero") / "fp.duckdb")
    build(BuildConfig(out=out, ops=("matmul", "softmax"), cases=64, replays=2, quick=True, include_triton=False,
                      workers=2))
    return Matcher.open(out)


def _verdicts(m: Matcher, op: str, variant: str, dtype: str, inputs: dict) -> tuple[bool, bool]:
    """(matcher warns, the twin finds a fault in a noisy replay or the deterministic run)."""
    r = m.assess(op, variant, dtype, inputs=inputs)
    t = twin.run(op, variant, dtype, inputs=inputs, noise="stochastic", replays=4, seed=0)
    return r.warn, any(t.faults.values()) or max(t.probability.values()) > 0


def _healthy_calls() -> list[tuple[str, str, str, dict]]:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 64, generator=g).to(F16)
    calls = [
        ("lora B zero", "matmul", "float16", {"a": a, "b": torch.zeros(64, 8, dtype=F16)}),  # x @ B.T, B zero-init
        ("zero activations", "matmul", "float16", {"a": torch.zeros(16, 64, dtype=F16), "b": a.T.contiguous()}),
        ("both zero", "matmul", "float16", {"a": torch.zeros(8, 8, dtype=F16), "b": torch.zeros(8, 8, dtype=F16)}),
        ("both zero bf16", "matmul", "bfloat16", {"a": torch.zeros(8, 8, dtype=torch.bfloat16),
                                                  "b": torch.zeros(8, 8, dtype=torch.bfloat16)}),
    ]
    for s in (0.0, 1e-4, 1e-3):  # uniform and near-uniform logits (a router at init: 8 experts)
        calls.append((f"logits*{s}", "softmax", "float16", {"x": (torch.randn(64, 8, generator=g) * s).to(F16)}))
        calls.append((f"logits*{s} n128", "softmax", "float32", {"x": torch.randn(4, 128, generator=g) * s}))
    return calls


@pytest.mark.parametrize("name,op,dtype,inputs", _healthy_calls(), ids=lambda v: v if isinstance(v, str) else "")
def test_zero_and_tiny_inputs_do_not_warn(m: Matcher, name: str, op: str, dtype: str, inputs: dict) -> None:
    variant = "torch"
    warn, fault = _verdicts(m, op, variant, dtype, inputs)
    assert not fault, f"{name}: the twin itself faults; not a healthy call"
    assert not warn, f"{name}: {m.assess(op, variant, dtype, inputs=inputs)}"


def test_a_real_fault_next_to_them_still_warns(m: Matcher) -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(32, 64, generator=g).to(F16)
    b = (torch.randn(64, 16, generator=g) * 1e-7).to(F16)  # fp16 subnormal weights: the products lose their digits
    warn, fault = _verdicts(m, "matmul", "torch", "float16", {"a": a, "b": b})
    assert fault and warn
    x = torch.zeros(4, 64, dtype=F16)
    x[1] = -torch.inf  # zero logits, one fully masked row: NaN
    assert m.assess("softmax", "torch", "float16", inputs={"x": x}).warn


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("sweep", [default_sweep, boundary_sweep])
def test_sweeps_replay_zero_operands_and_uniform_logits(sweep, dtype: str) -> None:
    # every build runs one of these two sweeps for each op (the boundary sweep even with a profile)
    mm = [sketch("matmul", c.inputs) for c in sweep("matmul", dtype, 192, 0)]
    assert sum(s["out_bound"] == 0.0 and s["absmax"] > 0 for s in mm) >= 2  # one operand zero
    sm = [sketch("softmax", c.inputs) for c in sweep("softmax", dtype, 192, 0)]
    assert any(s["max"] == 0.0 and s["min_row_max"] == 0.0 and s["masked_rows"] == 0 for s in sm)
    assert any(0.0 < s["max"] < 1e-2 for s in sm)
