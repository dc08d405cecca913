"""No magnitude feature of a sketch is -0.0: an all-zero input (or parameter) gives +0.0 absmax-like
features on both the CPU fast path and the float64 path, for every catalog op.

    python -m pytest -q tests/test_ingest_sketch_zero_sign.py
"""

from __future__ import annotations

import math

import pytest
import torch

from optwin.catalog import CATALOG
from optwin.ingest.sketch import SIGNED_FEATURES, sketch, sketch_tensor

DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def sample(op: str, dtype: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Small valid inputs of op (every value nonzero, so the zeroed one is the only zero)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: (torch.rand(*s, generator=g) + 0.5).to(DT[dtype])  # noqa: E731
    if op == "rmsnorm":
        return {"x": r(4, 64), "weight": r(64)}
    if op == "softmax":
        return {"x": r(3, 40)}
    if op == "rope":
        return {"x": r(5, 2, 8), "positions": torch.arange(1, 6)}
    if op == "attention":
        return {"q": r(1, 2, 6, 16), "k": r(1, 2, 9, 16), "v": r(1, 2, 9, 16)}
    if op == "layernorm":
        return {"x": torch.randn(4, 64, generator=g).to(DT[dtype]), "weight": r(64), "bias": r(64)}
    if op == "geodesic":
        return {k: r(7) * 10 for k in ("lat1", "lon1", "lat2", "lon2")}
    if op == "matmul":
        return {"a": r(7, 70), "b": r(70, 5)}
    raise AssertionError(f"no sample for {op}: add one")


def cases() -> list[tuple[str, str, str]]:
    """(op, dtype, which input is zero; "all": every float input) over the catalog."""
    out = []
    for op, spec in CATALOG.items():
        floats = [n for n, v in sample(op, spec.dtypes[0]).items() if v.is_floating_point()]
        out += [(op, dt, z) for dt in spec.dtypes for z in ["all", *floats]]
    return out


@pytest.mark.parametrize("exact", [False, True], ids=["fast", "float64"])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["+0", "-0"])
@pytest.mark.parametrize(("op", "dtype", "zero"), cases())
def test_magnitudes_of_zeros_are_positive_zero(op: str, dtype: str, zero: str, sign: float, exact: bool) -> None:
    inputs = sample(op, dtype)
    for n, v in inputs.items():
        if v.is_floating_point() and zero in ("all", n):
            inputs[n] = torch.zeros_like(v).mul(sign)  # sign -1: every element -0.0
    names, values = sketch_tensor(op, inputs, exact=exact)
    # Signed features (softmax max/min, max_score, min_row_max) report a value of the input: the max of
    # -0.0 entries is -0.0. Every other feature is a count, a shape or a magnitude, never negative.
    neg = [n for n, v in zip(names, values.tolist()) if n not in SIGNED_FEATURES and math.copysign(1.0, v) < 0]
    assert not neg, f"{op} {dtype}, {zero} zero ({sign:+}0): {neg} are -0.0"
    if zero != "all":
        feature = {"weight": "weight_absmax", "bias": "bias_absmax", "v": "v_absmax", "b": "b_absmax"}.get(zero)
        if feature is not None:
            assert dict(zip(names, values.tolist()))[feature] == 0.0


def test_layernorm_zero_bias_reads_positive_zero() -> None:
    """The reported case: a float16 layernorm with an all-zero bias (nn.LayerNorm's init) on the fast path."""
    g = torch.Generator().manual_seed(1)
    sk = sketch("layernorm", {"x": torch.randn(4, 64, generator=g).half(), "weight": torch.ones(64).half(),
                              "bias": torch.zeros(64).half()})
    assert math.copysign(1.0, sk["bias_absmax"]) == 1.0
