"""Production variants as plain torch: spec-literal numerics, dispatch and errors.

    python -m pytest -q tests/test_kernels_production.py
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from optwin.catalog import CATALOG, all_triples
from optwin.errors import CatalogError, InputError
from optwin.kernels import production as P
from optwin.kernels.production import run_variant

DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _inputs(op: str, dtype: str, g: torch.Generator) -> tuple[dict[str, torch.Tensor], dict]:
    """Small seeded, well-conditioned inputs for each op."""
    dt = DT[dtype]
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    if op == "rmsnorm":
        return {"x": r(3, 5, 64).to(dt), "weight": (1 + 0.1 * r(64)).to(dt)}, {}
    if op == "softmax":
        return {"x": r(6, 33).to(dt)}, {}
    if op == "rope":
        return {"x": r(7, 3, 16).to(dt), "positions": torch.arange(7) * 3}, {"base": 10000.0}
    if op == "attention":
        return {n: r(2, 3, 9, 16).to(dt) for n in "qkv"}, {"causal": True}
    if op == "layernorm":
        return {"x": r(4, 48).to(dt), "weight": (1 + 0.1 * r(48)).to(dt), "bias": (0.1 * r(48)).to(dt)}, {}
    if op == "geodesic":
        lat = lambda: (torch.rand(50, generator=g, dtype=torch.float64) * 160 - 80).float()  # noqa: E731
        lon = lambda: (torch.rand(50, generator=g, dtype=torch.float64) * 360 - 180).float()  # noqa: E731
        return {"lat1": lat(), "lon1": lon(), "lat2": lat(), "lon2": lon()}, {}
    if op == "matmul":
        return {"a": r(8, 40).to(dt), "b": r(40, 6).to(dt)}, {}
    raise AssertionError(op)


def _ref64(op: str, inp: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    """Float64 math of each op, written independently of production.py."""
    d = {k: (v.double() if v.is_floating_point() else v) for k, v in inp.items()}
    if op == "rmsnorm":
        x = d["x"]
        return d["weight"] * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
    if op == "softmax":
        return torch.softmax(d["x"], -1)
    if op == "rope":
        x, pos = d["x"], d["positions"].double()
        dd = x.shape[-1]
        inv = 1.0 / params["base"] ** (torch.arange(0, dd, 2, dtype=torch.float64) / dd)
        ang = torch.cat([pos[:, None] * inv] * 2, -1)[:, None, :]
        rot = torch.cat([-x[..., dd // 2:], x[..., : dd // 2]], -1)
        return x * ang.cos() + rot * ang.sin()
    if op == "attention":
        q, k, v = d["q"], d["k"], d["v"]
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if params.get("causal"):
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
        return torch.softmax(s, -1) @ v
    if op == "layernorm":
        x = d["x"]
        m = x.mean(-1, keepdim=True)
        var = ((x - m) ** 2).mean(-1, keepdim=True)
        return (x - m) / torch.sqrt(var + 1e-5) * d["weight"] + d["bias"]
    if op == "geodesic":
        p1, l1, p2, l2 = (torch.deg2rad(d[k]) for k in ("lat1", "lon1", "lat2", "lon2"))
        a = torch.sin((p2 - p1) / 2) ** 2 + p1.cos() * p2.cos() * torch.sin((l2 - l1) / 2) ** 2
        return 2 * 6371.0088 * torch.asin(a.sqrt())
    if op == "matmul":
        return d["a"] @ d["b"]
    raise AssertionError(op)


# Relative L2 error allowed against float64 on well-conditioned inputs: a few units of the dtype.
REL = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 1e-5}


@pytest.mark.parametrize("op,variant,dtype", all_triples(include_triton=False))
def test_every_production_variant_matches_float64(op: str, variant: str, dtype: str) -> None:
    g = torch.Generator().manual_seed(hash((op, variant, dtype)) % 2**31)
    inp, params = _inputs(op, dtype, g)
    y = run_variant(op, variant, dtype, inp, params)
    assert y.dtype == DT[CATALOG[op].out_dtype(dtype)]
    assert y.device == next(iter(inp.values())).device
    r = _ref64(op, inp, params)
    assert y.shape == r.shape
    assert torch.isfinite(y).all()
    rel = ((y.double() - r).norm() / r.norm()).item()
    assert rel < REL[dtype], f"{op}/{variant}/{dtype}: rel L2 {rel:.3g}"


def test_native_dtype_rmsnorm_rounds_every_step() -> None:
    # x*x overflows float16 once |x| > 256: v = inf, rsqrt(inf) = 0, so native-dtype outputs 0 where
    # fp32-acc outputs 1.
    x = torch.full((2, 8), 300.0, dtype=torch.float16)
    w = torch.ones(8, dtype=torch.float16)
    assert torch.equal(run_variant("rmsnorm", "native-dtype", "float16", {"x": x, "weight": w}), torch.zeros_like(x))
    assert torch.allclose(run_variant("rmsnorm", "fp32-acc", "float16", {"x": x, "weight": w}).float(), torch.ones(2, 8))
    # the literal formula, op by op in dtype
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1)).half()
    v = (x * x).mean(-1, keepdim=True)
    want = w[0] * (x * torch.rsqrt(v + 1e-6))
    got = P.rmsnorm_native_dtype(x, torch.ones(32, dtype=torch.float16), 1e-6)
    assert torch.equal(got, want)


def test_naive_softmax_overflows_where_torch_does_not() -> None:
    x = torch.tensor([[12.0, 0.0, -1.0]], dtype=torch.float16)  # exp(12) > 65504
    assert torch.isnan(run_variant("softmax", "naive", "float16", {"x": x})).any()
    y = run_variant("softmax", "torch", "float16", {"x": x})
    assert torch.isfinite(y).all() and abs(y.float().sum().item() - 1) < 1e-3


def test_low_precision_angles_lose_position_digits() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 2, 32, generator=g).to(torch.bfloat16)
    pos = torch.tensor([0, 1, 2000, 4001])
    inp = {"x": x, "positions": pos}
    r = _ref64("rope", inp, {"base": 10000.0})
    err = lambda v: ((run_variant("rope", v, "bfloat16", inp).double() - r).norm() / r.norm()).item()  # noqa: E731
    assert err("low-precision-angles") > 10 * err("fp32-angles")
    # rows at positions 0 and 1 agree closely: the loss is in large positions
    a = run_variant("rope", "low-precision-angles", "bfloat16", inp)[:2].double()
    assert ((a - r[:2]).norm() / r[:2].norm()).item() < 2e-2


def test_one_pass_layernorm_cancels_when_mean_dominates() -> None:
    g = torch.Generator().manual_seed(3)
    x = (1e4 + torch.randn(2, 256, generator=g, dtype=torch.float64)).float()
    w, b = torch.ones(256), torch.zeros(256)
    inp = {"x": x, "weight": w, "bias": b}
    r = _ref64("layernorm", inp, {})
    err = lambda v: ((run_variant("layernorm", v, "float32", inp).double() - r).norm() / r.norm()).item()  # noqa: E731
    assert err("torch") < 2e-3  # m carries ~|mean| * u_fp32 = 6e-4 absolute error
    assert not err("one-pass") < 1e-1  # NaN (negative variance) or a large error


def test_acos_geodesic_loses_nearby_points() -> None:
    lat = torch.tensor([10.0, 45.0], dtype=torch.float32)
    lon = torch.tensor([20.0, -3.0], dtype=torch.float32)
    inp = {"lat1": lat, "lon1": lon, "lat2": lat + 1e-4, "lon2": lon + 1e-4}
    r = _ref64("geodesic", inp, {})
    hav = run_variant("geodesic", "haversine", "float32", inp).double()
    acs = run_variant("geodesic", "acos", "float32", inp).double()
    assert ((hav - r).abs() / r).max() < 1e-2
    assert not ((acs - r).abs() / r).max() < 1e-1


def test_math_attention_causal_matches_sdpa_masking() -> None:
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
    a = P.attention_math(q, k, v, True)
    b = P.attention_sdpa(q, k, v, True)
    assert torch.allclose(a, b, atol=1e-5)
    # the first query sees only the first key
    assert torch.allclose(a[:, :, 0], v[:, :, 0], atol=1e-6)


@pytest.mark.parametrize(
    "call,err",
    [
        (lambda: run_variant("nope", "torch", "float32", {}), CatalogError),
        (lambda: run_variant("softmax", "fast", "float32", {"x": torch.zeros(1, 2)}), CatalogError),
        (lambda: run_variant("geodesic", "acos", "float16", {}), CatalogError),
        (lambda: run_variant("rope", "fp32-angles", "float32", {"x": torch.zeros(1, 1, 2), "positions": torch.zeros(1, dtype=torch.long)}, {"bass": 1}), CatalogError),
        (lambda: run_variant("softmax", "torch", "float16", {"x": torch.zeros(1, 2)}), InputError),
        (lambda: run_variant("softmax", "torch", "float32", {"y": torch.zeros(1, 2)}), InputError),
        (lambda: run_variant("rope", "fp32-angles", "float32", {"x": torch.zeros(1, 2), "positions": torch.zeros(1, dtype=torch.long)}), InputError),
        (lambda: run_variant("rope", "fp32-angles", "float32", {"x": torch.zeros(1, 1, 2), "positions": torch.zeros(1)}), InputError),
    ],
)
def test_bad_calls_raise_one_line_errors(call, err) -> None:
    with pytest.raises(err) as e:
        call()
    assert "\n" not in str(e.value)


def test_import_kernels_does_not_import_triton() -> None:
    code = "import sys, optwin.kernels, optwin.kernels.production; assert 'triton' not in sys.modules, 'triton'"
    subprocess.run([sys.executable, "-c", code], check=True)
