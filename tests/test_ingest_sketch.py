"""Sketch and validate_sketch against hand-computed float64 references.

    python -m pytest -q tests/test_ingest_sketch.py
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from optwin.catalog import CATALOG
from optwin.errors import CatalogError, InputError, SketchError
from optwin.fingerprints.regions import with_derived
from optwin.ingest import SKETCH_FEATURES, sketch, sketch_tensor, validate_sketch


def _inputs(op: str, g: torch.Generator, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    r = lambda *s: (torch.randn(*s, generator=g) * 3).to(dtype)  # noqa: E731
    return {
        "rmsnorm": lambda: {"x": r(2, 5, 33), "weight": r(33)},
        "softmax": lambda: {"x": r(7, 19)},
        "rope": lambda: {"x": r(9, 3, 16), "positions": torch.arange(9) * 1000},
        "attention": lambda: {"q": r(2, 3, 5, 8), "k": r(2, 3, 11, 8), "v": r(2, 3, 11, 8)},
        "layernorm": lambda: {"x": r(6, 40) + 50, "weight": r(40), "bias": r(40)},
        "geodesic": lambda: {k: (torch.rand(13, generator=g) * 160 - 80).float() for k in ("lat1", "lon1", "lat2", "lon2")},
        "matmul": lambda: {"a": r(6, 17), "b": r(17, 4)},
    }[op]()


@pytest.mark.parametrize("op", list(CATALOG))
def test_features_match_catalog_and_are_finite(op: str) -> None:
    g = torch.Generator().manual_seed(1)
    s = sketch(op, _inputs(op, g))
    assert tuple(s) == SKETCH_FEATURES[op]
    assert set(CATALOG[op].region_features) <= set(with_derived(op, s))  # derived ones follow from the sketch
    assert all(isinstance(v, float) and math.isfinite(v) for v in s.values())
    assert validate_sketch(op, s) == s
    names, t = sketch_tensor(op, _inputs(op, torch.Generator().manual_seed(1)))
    assert names == SKETCH_FEATURES[op] and t.dtype == torch.float64 and t.shape == (len(names),)


def test_rmsnorm_reference() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 6, 32, generator=g).half() * 20
    w = torch.randn(32, generator=g).half()
    x[1, 2, 3] = math.nan
    s = sketch("rmsnorm", {"x": x, "weight": w})
    h = x.double().numpy().reshape(-1, 32)
    fin = np.isfinite(h)
    hz = np.where(fin, h, 0)
    assert s["rows"] == 24 and s["hidden"] == 32 and s["numel"] == 4 * 6 * 32 and s["nonfinite"] == 1
    assert s["absmax"] == pytest.approx(np.abs(hz).max())
    assert s["rms"] == pytest.approx(math.sqrt((hz**2).sum() / fin.sum()))
    assert s["max_row_rms"] == pytest.approx(np.sqrt((hz**2).sum(1) / fin.sum(1)).max())
    assert s["weight_absmax"] == pytest.approx(w.double().abs().max().item())


def test_softmax_masks_and_nonfinite() -> None:
    x = torch.tensor([[1.0, -math.inf, 3.0, -2.0], [-math.inf] * 4, [math.nan, 0.5, math.inf, -math.inf]])
    s = sketch("softmax", {"x": x})
    assert s["masked_rows"] == 1 and s["masked_frac"] == pytest.approx(6 / 12)
    assert s["nonfinite"] == 2  # NaN and +inf; -inf is a mask
    assert s["max"] == 3.0 and s["min"] == -2.0
    assert s["max_row_range"] == 5.0  # row 0: 3 - (-2); fully masked row counts 0
    allmasked = sketch("softmax", {"x": torch.full((3, 5), -math.inf)})
    assert allmasked["masked_rows"] == 3 and allmasked["max"] == 0 and allmasked["absmax"] == 0 and allmasked["nonfinite"] == 0


def test_softmax_negative_max_is_signed() -> None:
    s = sketch("softmax", {"x": torch.tensor([[-5.0, -7.0], [-9.0, -6.0]])})
    assert s["max"] == -5.0 and s["min"] == -9.0 and s["max_row_range"] == 3.0


def test_rope_attention_matmul_reference() -> None:
    g = torch.Generator().manual_seed(3)
    s = sketch("rope", {"x": torch.randn(5, 2, 8, generator=g), "positions": torch.tensor([0, 7, -3, 2**21, 4])}, {"base": 500000.0})
    assert (s["seq"], s["heads"], s["d"], s["rows"], s["max_pos"], s["base"]) == (5, 2, 8, 10, 2**21, 500000.0)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (3, 4, 4))
    a = sketch("attention", {"q": q, "k": k, "v": v}, {"causal": True})
    bound = q.double().norm(dim=-1).max() * k.double().norm(dim=-1).max() / 4
    assert a["score_bound"] == pytest.approx(bound.item()) and a["causal"] == 1.0
    scores = (q.double() @ k.double().transpose(-1, -2)) / 4
    assert scores.abs().max().item() <= a["score_bound"]
    assert a["absmax"] == pytest.approx(max(q.abs().max().item(), k.abs().max().item()))
    am, bm = torch.randn(7, 9, generator=g), torch.randn(9, 3, generator=g)
    m = sketch("matmul", {"a": am, "b": bm})
    assert m["out_bound"] == pytest.approx((am.double().norm(dim=1).max() * bm.double().norm(dim=0).max()).item())
    assert (am.double() @ bm.double()).abs().max().item() <= m["out_bound"]
    assert (m["m"], m["k"], m["n"], m["rows"]) == (7, 9, 3, 7)


def test_layernorm_ratio_over_varying_rows_and_constant_rows_apart() -> None:
    x = torch.tensor([[1e6 + 1, 1e6 - 1, 1e6 + 1, 1e6 - 1], [2.0, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0],
                      [-3.0, -3.0, -3.0, -3.0]], dtype=torch.float64)
    ln = lambda x: sketch("layernorm", {"x": x, "weight": torch.ones(4), "bias": torch.zeros(4)})  # noqa: E731
    s = ln(x[:1])
    assert s["max_mean_over_std"] == pytest.approx(1e6, rel=1e-12) and s["min_row_std"] == pytest.approx(1.0)
    assert s["const_absmax"] == 0.0
    s = ln(x)  # constant rows (2, 0, -3) leave the ratio to the varying row; the largest |c| is 3
    assert s["max_mean_over_std"] == pytest.approx(1e6, rel=1e-12) and s["min_row_std"] == 0.0
    assert s["const_absmax"] == 3.0
    s = ln(x[1:])  # every row constant: no ratio at all
    assert (s["max_mean_over_std"], s["min_row_std"], s["const_absmax"]) == (0.0, 0.0, 3.0)
    s = ln(x[2:3])  # a zero row is constant with c = 0
    assert (s["max_mean_over_std"], s["const_absmax"]) == (0.0, 0.0)


def test_geodesic_haversine_degrees() -> None:
    lat1 = torch.tensor([0.0, 10.0, 45.0, math.nan])
    lon1 = torch.tensor([0.0, 20.0, 0.0, 0.0])
    lat2 = torch.tensor([0.0, 10.0, -45.0, 1.0])
    lon2 = torch.tensor([1e-6, 20.0 + 1.0, 180.0, 0.0])
    s = sketch("geodesic", {"lat1": lat1, "lon1": lon1, "lat2": lat2, "lon2": lon2})
    assert s["nonfinite"] == 1 and s["n"] == 4 and s["rows"] == 4
    assert s["min_sep_deg"] == pytest.approx(1e-6, rel=1e-6)  # equator: 1e-6 degrees of longitude
    assert s["max_sep_deg"] == pytest.approx(180.0)  # (45, 0) and (-45, 180) are antipodal
    sep10 = math.degrees(2 * math.asin(math.sqrt(math.cos(math.radians(10)) ** 2 * math.sin(math.radians(0.5)) ** 2)))
    assert s["median_sep_deg"] == pytest.approx(sep10)  # lower median of 3 valid pairs
    # rms over the 3 valid pairs only (the NaN pair neither counts nor poisons it)
    assert s["rms_sep_deg"] == pytest.approx(math.sqrt((1e-12 + sep10**2 + 180.0**2) / 3), rel=1e-9)
    assert s["absmax"] == 45.0


def test_empty_inputs_are_refused_and_masked_rows_are_zero() -> None:
    # optwin.validation refuses empty tensors; an all-masked softmax input still gives zeros, not NaN.
    with pytest.raises(InputError, match="empty"):
        sketch("matmul", {"a": torch.empty(0, 3), "b": torch.empty(3, 2)})
    s = sketch("softmax", {"x": torch.full((2, 3), -math.inf)})
    assert all(math.isfinite(v) for v in s.values()) and s["absmax"] == 0 and s["rms"] == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_float32_extremes_do_not_overflow(dtype: torch.dtype) -> None:
    big = torch.finfo(dtype).max
    x = torch.full((2, 64), big, dtype=dtype)
    s = sketch("rmsnorm", {"x": x, "weight": torch.ones(64, dtype=dtype)})
    assert s["rms"] == pytest.approx(big) and s["max_row_rms"] == pytest.approx(big)


def test_bad_inputs_raise_one_line_errors() -> None:
    with pytest.raises(CatalogError, match="unknown operator 'gelu'"):
        sketch("gelu", {"x": torch.ones(2)})
    with pytest.raises(InputError, match=r"rmsnorm: missing \['weight'\]") as e:
        sketch("rmsnorm", {"x": torch.ones(2, 4)})
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="unexpected \\['bias'\\]"):
        sketch("rmsnorm", {"x": torch.ones(2, 4), "weight": torch.ones(4), "bias": torch.ones(4)})
    with pytest.raises(InputError, match=r"rope: input 'x' must be \[seq, heads, d\]"):
        sketch("rope", {"x": torch.ones(2, 4), "positions": torch.arange(2)})
    with pytest.raises(InputError, match=r"weight must be \[hidden\] = \[4\], got \[3\]"):
        sketch("rmsnorm", {"x": torch.ones(2, 4), "weight": torch.ones(3)})
    with pytest.raises(InputError, match="must be a torch.Tensor"):
        sketch("softmax", {"x": [1.0, 2.0]})
    with pytest.raises(InputError, match="disagree on k"):
        sketch("matmul", {"a": torch.ones(2, 4), "b": torch.ones(3, 2)})
    with pytest.raises(CatalogError, match="unknown params"):
        sketch("softmax", {"x": torch.ones(2, 4)}, {"causal": True})


def test_validate_sketch_rejects() -> None:
    good = sketch("softmax", {"x": torch.randn(3, 4, generator=torch.Generator().manual_seed(0))})
    cases = [
        ({k: v for k, v in good.items() if k != "max"}, "missing features max"),
        ({**good, "n": True}, "n must be a number"),
        ({**good, "n": "4"}, "n must be a number"),
        ({**good, "n": None}, "n must be a number"),
        ({**good, "rms": math.nan}, "rms must be finite"),
        ({**good, "rms": math.inf}, "rms must be finite"),
        ({**good, "masked_rows": -1}, "masked_rows must be >= 0"),
        ({**good, "masked_frac": 1.5}, "masked_frac must be within"),
        ([1, 2], "must be a JSON object"),
    ]
    for bad, msg in cases:
        with pytest.raises(SketchError, match=msg) as e:
            validate_sketch("softmax", bad)
        assert "\n" not in str(e.value)
    ok = validate_sketch("softmax", {**good, "max": -3, "n": np.int64(4), "extra": "ignored"})
    assert ok["max"] == -3.0 and isinstance(ok["n"], float) and "extra" not in ok
    with pytest.raises(SketchError, match="must be a number"):
        validate_sketch("softmax", {**good, "n": np.bool_(True)})
    with pytest.raises(CatalogError):
        validate_sketch("nope", good)


def test_import_is_light() -> None:
    code = "import sys, optwin.ingest; print(sorted(m for m in ('polars','scipy','safetensors','transformers','duckdb','pyarrow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_cpu_fast_path_agrees_with_exact_float64_path(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(11)
    cases = {
        "rmsnorm": {"x": torch.randn(3, 7, 96, generator=g) * 4, "weight": torch.randn(96, generator=g)},
        "matmul": {"a": torch.randn(40, 96, generator=g), "b": torch.randn(96, 24, generator=g) * 1e-3},
        "attention": {"q": torch.randn(2, 3, 9, 16, generator=g), "k": torch.randn(2, 3, 11, 16, generator=g) * 30,
                      "v": torch.randn(2, 3, 11, 16, generator=g)},
        "layernorm": {"x": torch.randn(12, 64, generator=g) * 2 + 5, "weight": torch.randn(64, generator=g),
                      "bias": torch.randn(64, generator=g)},
    }
    for op, inp in cases.items():
        inp = {k: v.to(dtype) for k, v in inp.items()}
        names, fast = sketch_tensor(op, inp)
        _, exact = sketch_tensor(op, inp, exact=True)
        assert torch.allclose(fast, exact, rtol=2e-6, atol=0), (op, dict(zip(names, (fast - exact).tolist())))
    # Outside the fast range (tiny values, inf) the fast path steps aside: results stay exact.
    tiny = {"a": torch.full((4, 8), 1e-30), "b": torch.full((8, 2), 1e-20)}
    assert sketch("matmul", tiny)["out_bound"] == pytest.approx(8e-50, rel=1e-6)
    x = torch.randn(4, 8, generator=g)
    x[1, 1] = math.inf
    assert sketch("rmsnorm", {"x": x, "weight": torch.ones(8)})["nonfinite"] == 1


def test_weight_cache_follows_in_place_updates() -> None:
    from optwin.ingest.sketch import WeightCache

    lin = torch.nn.Linear(8, 4)
    cache = WeightCache()
    a = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    _, v1 = sketch_tensor("matmul", {"a": a, "b": lin.weight.T}, cache=cache)
    with torch.no_grad():
        lin.weight.mul_(10.0)  # bumps _version: the cached statistics must not be reused
    _, v2 = sketch_tensor("matmul", {"a": a, "b": lin.weight.T}, cache=cache)
    _, v3 = sketch_tensor("matmul", {"a": a, "b": lin.weight.T}, exact=True)
    assert torch.allclose(v2, v3, rtol=2e-6) and not torch.allclose(v1, v2)
