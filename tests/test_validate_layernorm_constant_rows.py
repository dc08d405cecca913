"""Layernorm inputs with exactly constant rows (issue #8): sketch, twin, generators, fit, regions, matcher.

    python -m pytest -q tests/test_validate_layernorm_constant_rows.py

A constant row c has an infinite |mean|/std, but for float16/bfloat16 input its fp32 mean is exact
and the one-pass output is the bias: it only faults by NaN (c^2 overflowing fp32). The sketch keeps
such rows out of max_mean_over_std and reports their largest |c| as const_absmax, a region feature,
so held-out fp16 inputs whose rows all rounded to constants no longer share a cell with cancelling rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from optwin import twin
from optwin.catalog import CATALOG
from optwin.fingerprints.regions import feature_bin, region_of
from optwin.ingest import sketch, sketch_tensor
from optwin.ingest.generate import boundary_sweep, default_sweep, make_layernorm
from optwin.validate.families import held_out_case

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def _ln(x: torch.Tensor, bias: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    h = x.shape[-1]
    b = bias if bias is not None else torch.linspace(-0.3, 0.3, h, dtype=torch.float64).to(x.dtype)
    return {"x": x, "weight": torch.ones(h, dtype=x.dtype), "bias": b}


def _constant_held_out(dtype: str, n: int = 60) -> list:
    """Held-out (seed 0) cases of dtype whose every row is exactly constant, with their inputs."""
    out = []
    for i in range(n):
        c = held_out_case("layernorm", dtype, i, seed=0)
        r = c.inputs["x"].double().reshape(-1, c.inputs["x"].shape[-1])
        if bool((r.amin(-1) == r.amax(-1)).all()):
            out.append(c)
    return out


def test_held_out_fp16_constant_rows_have_no_ratio_and_the_one_pass_output_is_the_bias() -> None:
    cases = _constant_held_out("float16")
    assert len(cases) >= 5  # huge mean/std targets round to constant rows in fp16: the FP block of issue #8
    for c in cases:
        s = sketch("layernorm", c.inputs)
        assert s["max_mean_over_std"] == 0.0 and s["min_row_std"] == 0.0
        assert s["const_absmax"] == s["absmax"] > 0
        res = twin.run("layernorm", "one-pass", "float16", c.inputs)
        assert not any(res.faults.values()) and res.rel_error == 0.0
        bias = c.inputs["bias"].double().expand_as(res.emulated)
        assert torch.equal(res.emulated, bias)  # (h - m) = 0 exactly: y = bias


def test_constant_row_ratio_comes_from_the_varying_rows_only() -> None:
    g = torch.Generator().manual_seed(0)
    x = (1000.0 + torch.randn(4, 64, generator=g, dtype=torch.float64)).to(F32)  # (4, 64), ratio ~ 1e3
    ref = sketch("layernorm", _ln(x))
    x2 = x.clone()
    x2[2] = -7.5  # one constant row
    s = sketch("layernorm", _ln(x2))
    keep = torch.tensor([0, 1, 3])
    assert s["max_mean_over_std"] == pytest.approx(sketch("layernorm", _ln(x[keep]))["max_mean_over_std"], rel=1e-12)
    assert s["max_mean_over_std"] <= ref["max_mean_over_std"] and s["const_absmax"] == 7.5 and s["min_row_std"] == 0.0
    # The CPU fast path (float32 statistics) must not see a constant row as a tiny-std row: it steps aside.
    x5 = torch.randn(6, 384, generator=g).to(F32)  # (6, 384): alone, it takes the fast path
    x5[4] = 1000.3  # fp32 mean of 384 copies is inexact: a float32 std would be tiny but > 0
    names, fast = sketch_tensor("layernorm", _ln(x5))
    _, exact = sketch_tensor("layernorm", _ln(x5), exact=True)
    assert torch.equal(fast, exact) and dict(zip(names, fast.tolist()))["const_absmax"] == pytest.approx(1000.3, rel=1e-6)
    # A row constant but for one element is not constant: its cancellation is real and its ratio huge.
    x3 = torch.full((1, 64), 1000.0, dtype=F32)
    x3[0, 5] = 1000.0625
    s3 = sketch("layernorm", _ln(x3))
    assert s3["const_absmax"] == 0.0 and s3["max_mean_over_std"] > 1e4
    # Non-finite entries do not count: a row whose finite entries are equal is constant.
    x4 = torch.full((2, 8), 3.0, dtype=F16)
    x4[0, 1] = float("nan")
    s4 = sketch("layernorm", _ln(x4))
    assert (s4["const_absmax"], s4["max_mean_over_std"], s4["nonfinite"]) == (3.0, 0.0, 1.0)


def test_kernel_recipe_row_min_equals_row_max_matches_the_sketch() -> None:
    """The kernel's definition: constant when row min == row max; |c| = max(|min|, |max|)."""
    for dtype in ("float16", "bfloat16", "float32"):
        for i in range(30):
            c = held_out_case("layernorm", dtype, i, seed=0)
            r = c.inputs["x"].float().reshape(-1, c.inputs["x"].shape[-1])  # what a kernel holds: fp32 rows
            mn, mx = r.amin(-1), r.amax(-1)
            want = float(torch.where(mn == mx, torch.maximum(mn.abs(), mx.abs()), 0.0).amax())
            assert sketch("layernorm", c.inputs)["const_absmax"] == want, (dtype, i)


@pytest.mark.parametrize("dtype", [BF16, F32])
def test_constant_rows_fault_only_by_nan_when_c_squared_overflows_fp32(dtype: torch.dtype) -> None:
    name = str(dtype).split(".")[-1]
    for c, nan in ((3.0, False), (1e4, False), (1e18, False), (1e20, True)):
        res = twin.run("layernorm", "one-pass", name, _ln(torch.full((2, 384), c, dtype=dtype)))
        assert res.faults["nonfinite"] is nan and (nan or not res.faults["precision_loss"]), (name, c)
    fp16 = twin.run("layernorm", "one-pass", "float16", _ln(torch.full((3, 1024), 60000.0, dtype=F16)))
    assert not any(fp16.faults.values())


def test_make_layernorm_hits_const_absmax_and_keeps_the_ratio_target() -> None:
    rng = np.random.default_rng(0)
    c = make_layernorm(rng, F32, rows=10, hidden=128, family="normal", max_mean_over_std=50.0, absmax=300.0,
                       const_rows=3, const_absmax=1234.5)
    s = sketch("layernorm", c.inputs)
    assert s["const_absmax"] == 1234.5 and s["absmax"] == 1234.5
    assert s["max_mean_over_std"] == pytest.approx(50.0, rel=1e-3)
    assert c.family == "normal+const-rows"
    r = c.inputs["x"].reshape(-1, 128)
    assert int((r.amin(-1) == r.amax(-1)).sum()) == 3
    allc = make_layernorm(np.random.default_rng(1), F16, rows=5, hidden=64, family="heavy", max_mean_over_std=2.0,
                          absmax=10.0, const_rows=5, const_absmax=0.75)
    s = sketch("layernorm", allc.inputs)
    assert (s["max_mean_over_std"], s["const_absmax"]) == (0.0, 0.75) and s["absmax"] <= 0.75
    # Without constant rows the case is the one the constructor made before the option existed.
    kw = dict(rows=6, hidden=64, family="normal", max_mean_over_std=9.0, absmax=3.0)
    a = make_layernorm(np.random.default_rng(2), F16, **kw)
    b = make_layernorm(np.random.default_rng(2), F16, **kw, const_rows=2, const_absmax=5.0)
    xa, xb = a.inputs["x"].reshape(6, 64), b.inputs["x"].reshape(6, 64)  # (6, 64)
    varying = xb.amin(-1) != xb.amax(-1)
    assert int(varying.sum()) == 4 and torch.equal(xa[varying], xb[varying])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_sweeps_cover_constant_rows_over_a_range_of_c(dtype: str) -> None:
    sk = [sketch("layernorm", c.inputs) for c in boundary_sweep("layernorm", dtype, 120, 0)]
    cs = [s["const_absmax"] for s in sk if s["const_absmax"] > 0]
    assert len(cs) >= 20 and min(cs) < 1.0
    assert max(cs) > (1e4 if dtype == "float16" else 1e19)  # fp16 up to its max; c^2 past fp32's range otherwise
    assert any(s["max_mean_over_std"] == 0.0 for s in sk) and any(s["max_mean_over_std"] > 0 and s["const_absmax"] > 0
                                                                   for s in sk)
    dflt = [sketch("layernorm", c.inputs)["const_absmax"] for c in default_sweep("layernorm", dtype, 60, 0)]
    assert sum(v > 0 for v in dflt) >= 5


def test_profile_samples_reproduce_constant_rows() -> None:
    import polars as pl

    from optwin.ingest import fit_sketches, sample_inputs

    rng = np.random.default_rng(5)
    rows = []
    for i in range(40):
        k = [0, 1, 4][i % 3]
        c = make_layernorm(rng, F16, rows=4, hidden=64, family="normal", max_mean_over_std=float(rng.uniform(1, 50)),
                           absmax=float(rng.uniform(1, 20)), const_rows=k, const_absmax=float(rng.uniform(0.5, 30)))
        rows.append({"op": "layernorm", "variant": "one-pass", "dtype": "float16", **sketch("layernorm", c.inputs)})
    fitted = fit_sketches(pl.DataFrame(rows))
    got = [sketch("layernorm", c.inputs) for c in sample_inputs("layernorm", "float16", fitted, 30, 0)]
    with_c = [s for s in got if s["const_absmax"] > 0]
    assert 5 <= len(with_c) < 30
    assert all(s["const_absmax"] <= s["absmax"] * (1 + 1e-3) for s in got)
    assert any(s["max_mean_over_std"] == 0.0 for s in with_c)  # "no varying row" draws: every row constant


def test_regions_keep_constant_rows_apart() -> None:
    assert CATALOG["layernorm"].region_features[-2] == "const_absmax"
    base = {"max_mean_over_std": 0.0, "absmax": 12.0, "const_absmax": 0.0, "hidden": 64.0}
    const = dict(base, const_absmax=12.0)
    cancel = dict(base, max_mean_over_std=1e6)
    r0, rc, rx = (region_of("layernorm", s) for s in (base, const, cancel))
    assert len({r0, rc, rx}) == 3 and rc[0] == r0[0] != rx[0]
    assert feature_bin("const_absmax", 1e-3) - feature_bin("const_absmax", 0.0) > 100  # no neighbour blurs 0 into c > 0


def test_matcher_on_a_real_layernorm_build_stays_quiet_on_constant_fp16_rows(tmp_path) -> None:
    from optwin.fingerprints.build import BuildConfig, build
    from optwin.fingerprints.matcher import Matcher

    out = str(tmp_path / "ln.duckdb")
    build(BuildConfig(out=out, ops=("layernorm",), cases=48, replays=4, quick=True, include_triton=False, workers=2))
    m = Matcher.open(out)
    cases = _constant_held_out("float16")
    warned = [m.assess("layernorm", "one-pass", "float16", sketch=sketch("layernorm", c.inputs)).warn for c in cases]
    assert sum(warned) <= len(cases) // 5, warned
    # ... while a near-constant row (one element off) of the same size is the cancelling case it always was: its
    # variance cancels to a negative (NaN, since CUDA's mean factor in TWIN_VERSION 2) or to noise (precision loss)
    x = torch.full((4, 384), 600.0, dtype=F16)
    x[:, 7] = 600.5
    risk = m.assess("layernorm", "one-pass", "float16", sketch=sketch("layernorm", _ln(x)))
    assert any(twin.run("layernorm", "one-pass", "float16", _ln(x)).faults.values()) and risk.warn


def test_constant_rows_at_widths_that_are_not_powers_of_two_get_cells_of_their_own() -> None:
    # A constant row's fp32 mean is exact at a power-of-two width and can round at 384 (aten's uneven merges,
    # one-pass's rounded 1/n): the seed-4 labels' false warnings came from cells averaging both (stop 47).
    const = {"max_mean_over_std": 0.0, "absmax": 12.0, "const_absmax": 12.0}
    r = {h: region_of("layernorm", dict(const, hidden=float(h))) for h in (64, 1024, 384, 768, 127)}
    assert r[64] == r[1024] and r[384] == r[768] == r[127] and r[64] != r[384]
    assert r[384][-1] - r[64][-1] > 10  # a flag far apart on the grid: interpolation never mixes the two
    varying = {"max_mean_over_std": 3.0, "absmax": 12.0, "const_absmax": 0.0}
    assert region_of("layernorm", dict(varying, hidden=64.0)) == region_of("layernorm", dict(varying, hidden=384.0))
    zero_rows = dict(varying, max_mean_over_std=0.0)  # rows of zeros: constant, but their mean is exact anywhere
    assert region_of("layernorm", dict(zero_rows, hidden=384.0)) == region_of("layernorm", dict(zero_rows, hidden=64.0))
