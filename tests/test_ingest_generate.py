"""default_sweep / boundary_sweep / constructors: contract the fingerprint builder relies on.

    python -m pytest -q tests/test_ingest_generate.py
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from optwin.catalog import CATALOG
from optwin.errors import CatalogError
from optwin.ingest import Case, boundary_sweep, default_sweep, sketch
from optwin.ingest.generate import make_attention, make_layernorm, make_matmul, make_rmsnorm, make_softmax

TRIPLES = [(op, dt) for op in CATALOG for dt in CATALOG[op].dtypes]
_T = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@pytest.mark.parametrize("sweep", [default_sweep, boundary_sweep])
@pytest.mark.parametrize("op,dtype", TRIPLES)
def test_cases_follow_the_catalog(sweep, op: str, dtype: str) -> None:
    cases = sweep(op, dtype, 24, 7)
    assert len(cases) == 24
    spec = CATALOG[op]
    for c in cases:
        assert isinstance(c, Case) and c.family
        inputs, params = c  # unpacks like (inputs, params)
        assert tuple(inputs) == spec.input_names()
        for s in spec.inputs:
            t = inputs[s.name]
            want = torch.int64 if s.dtype == "int64" else torch.float32 if s.dtype == "float32" else _T[dtype]
            assert t.dtype == want and t.device.type == "cpu", (s.name, t.dtype)
            if t.is_floating_point():
                bad = ~torch.isfinite(t) if not s.allow_neg_inf else torch.isnan(t) | (t == math.inf)
                assert not bad.any(), (op, s.name)
        assert set(params) <= set(spec.params)
        sk = sketch(op, inputs, params)
        rows = sk["rows"]
        if op in ("rmsnorm", "softmax", "layernorm"):
            assert rows <= 64 and sk.get("hidden", sk.get("n")) <= 1024
        if op == "rope":
            assert sk["seq"] <= 64 and inputs["positions"].dtype == torch.int64
        if op == "attention":
            assert sk["seq_q"] <= 128 and sk["seq_k"] <= 128
        if op == "matmul":
            assert max(sk["m"], sk["k"], sk["n"]) <= 256
        assert all(math.isfinite(v) for v in sk.values())


@pytest.mark.parametrize("sweep", [default_sweep, boundary_sweep])
def test_deterministic_and_prefix_stable(sweep) -> None:
    for op in CATALOG:
        a = sweep(op, CATALOG[op].dtypes[0], 6, 3)
        b = sweep(op, CATALOG[op].dtypes[0], 9, 3)
        c = sweep(op, CATALOG[op].dtypes[0], 6, 4)
        for x, y in zip(a, b):
            assert x.family == y.family and x.params == y.params
            assert all(torch.equal(x.inputs[k], y.inputs[k]) for k in x.inputs)
        assert any(not torch.equal(x.inputs[k], y.inputs[k]) for x, y in zip(a, c) for k in x.inputs
                   if x.inputs[k].shape == y.inputs[k].shape) or any(
            x.inputs[k].shape != y.inputs[k].shape for x, y in zip(a, c) for k in x.inputs)


def _feature_range(op: str, dtype: str, feature: str, n: int = 120) -> tuple[float, float, list[dict]]:
    sk = [sketch(op, c.inputs, c.params) for c in boundary_sweep(op, dtype, n, 0)]
    vals = [s[feature] for s in sk]
    return min(vals), max(vals), sk


def test_boundary_sweep_crosses_the_fault_boundaries() -> None:
    lo, hi, _ = _feature_range("rmsnorm", "float16", "absmax")
    assert lo < 1e-2 and hi > 3e3  # fp16 native-dtype: x*x overflows past 256
    lo, hi, sk = _feature_range("softmax", "float16", "max")
    assert hi > 3e3 and lo < -100  # naive exp overflow (> 11.1) and underflow to 0/0
    assert sum(s["masked_rows"] > 0 for s in sk) >= 10 and max(s["max_row_range"] for s in sk) > 1e3
    lo, hi, _ = _feature_range("rope", "float16", "max_pos")
    assert hi > 2**20 and lo < 100
    _, hi, _ = _feature_range("rope", "float32", "max_pos")
    assert hi > 2**24  # float32 positions stop being exact at 2^24
    lo, hi, _ = _feature_range("layernorm", "float32", "max_mean_over_std")
    assert lo < 10 and hi > 1e6
    lo, hi, _ = _feature_range("attention", "float16", "score_bound")
    assert lo < 1 and hi > 65504
    lo, hi, _ = _feature_range("matmul", "float16", "out_bound")
    assert lo < 1e-5 and hi > 65504
    lo, hi, sk = _feature_range("geodesic", "float32", "min_sep_deg")
    assert 0 < min(s["min_sep_deg"] for s in sk if s["min_sep_deg"] > 0) < 1e-7 and hi > 0.1


def test_default_sweep_has_every_family() -> None:
    fam = lambda op: {c.family.split("+")[0] for c in default_sweep(op, CATALOG[op].dtypes[-1], 60, 0)}  # noqa: E731
    assert {"normal", "heavy", "outlier", "uniform"} <= fam("rmsnorm")
    assert {"random", "near-identical", "antipodal"} <= fam("geodesic")
    tags = {t for c in default_sweep("softmax", "float16", 60, 0) for t in c.family.split("+")}
    assert {"causal", "padding", "masked-rows"} <= tags


def test_constructors_hit_their_targets_in_float32() -> None:
    rng = np.random.default_rng(0)
    f32 = torch.float32
    s = sketch("rmsnorm", make_rmsnorm(rng, f32, rows=16, hidden=256, family="heavy", absmax=37.0, max_row_rms=5.0).inputs)
    assert s["absmax"] == pytest.approx(37.0, rel=1e-6) and s["max_row_rms"] == pytest.approx(5.0, rel=1e-5)
    s = sketch("softmax", make_softmax(rng, f32, rows=8, n=64, family="normal", max=12.5, max_row_range=30.0,
                                       mask="causal", masked_rows=2).inputs)
    assert (s["max"], s["masked_rows"]) == (pytest.approx(12.5, rel=1e-6), 2) and s["max_row_range"] == pytest.approx(30.0, rel=1e-5)
    c = make_attention(rng, f32, batch=1, heads=2, seq_q=8, seq_k=8, d=32, family="normal", score_bound=123.0, absmax=20.0)
    s = sketch("attention", c.inputs, c.params)
    assert s["score_bound"] == pytest.approx(123.0, rel=1e-5) and s["absmax"] == pytest.approx(20.0, rel=1e-5)
    s = sketch("layernorm", make_layernorm(rng, f32, rows=10, hidden=128, family="normal", max_mean_over_std=50.0, absmax=300.0).inputs)
    assert s["max_mean_over_std"] == pytest.approx(50.0, rel=1e-3) and s["absmax"] == pytest.approx(300.0, rel=1e-6)
    s = sketch("matmul", make_matmul(rng, f32, m=20, k=30, n=10, family="normal", out_bound=1e3, absmax=40.0).inputs)
    assert s["out_bound"] == pytest.approx(1e3, rel=1e-5) and s["absmax"] == pytest.approx(40.0, rel=1e-6)


def test_bad_op_or_dtype() -> None:
    with pytest.raises(CatalogError):
        default_sweep("gelu", "float16", 2, 0)
    with pytest.raises(CatalogError, match="unsupported dtype"):
        boundary_sweep("geodesic", "float16", 2, 0)
    with pytest.raises(CatalogError, match="unknown dtype"):
        boundary_sweep("softmax", "float8", 2, 0)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_aims_at_peaked_frac_and_keeps_its_bounds(causal: bool) -> None:
    got = []
    for target in (0.0, 0.25, 0.5):
        case = make_attention(np.random.default_rng(3), torch.float32, batch=2, heads=2, seq_q=24, seq_k=24, d=16,
                              family="normal", score_bound=40.0, absmax=6.0, causal=causal, peaked_frac=target)
        s = sketch("attention", case.inputs, case.params)
        assert s["score_bound"] == pytest.approx(40.0, rel=1e-4) and s["absmax"] == pytest.approx(6.0, rel=1e-4)
        # off by at most the rows no rescaling moves: the two rows holding the maxima, and with causal
        # masking each head's first row (one visible key: always peaked), 6 of 96 rows
        assert abs(s["peaked_frac"] - target) <= 6 / 96 + 1e-9, (target, s["peaked_frac"])
        got.append(s["peaked_frac"])
    assert got == sorted(got) and got[-1] - got[0] > 0.4
