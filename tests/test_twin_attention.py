"""attention twin: float16 score overflow in math vs sdpa, causal masks, agreement with torch, replays.

    python -m pytest -q tests/test_twin_attention.py
"""

from __future__ import annotations

import math

import pytest
import torch

from optwin import twin
from optwin.kernels.production import run_variant
from optwin.twin import attention
from optwin.twin.numerics import ulps_between

DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def qkv(seed: int, dtype: str, b: int = 1, h: int = 2, sq: int = 16, sk: int = 16, d: int = 32,
        scale: float = 1.0, positive_v: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, d, generator=g) * scale
    k = torch.randn(b, h, sk, d, generator=g) * scale
    # Positive v: no cancellation in p @ v, so output ulps measure the rounding, not a near-zero sum.
    v = torch.rand(b, h, sk, d, generator=g) if positive_v else torch.randn(b, h, sk, d, generator=g)
    return {n: t.to(DT[dtype]) for n, t in (("q", q), ("k", k), ("v", v))}


def constant_qk(q_entry: float, k_entry: float, d: int = 64) -> dict[str, torch.Tensor]:
    """Every score q.k = d * q_entry * k_entry exactly; v random, all in float16."""
    g = torch.Generator().manual_seed(0)
    return {"q": torch.full((1, 2, 4, d), q_entry).half(), "k": torch.full((1, 2, 6, d), k_entry).half(),
            "v": torch.randn(1, 2, 6, d, generator=g).half()}


def test_math_float16_score_overflow_while_sdpa_stays_finite() -> None:
    below = constant_qk(30.0, 31.25)  # q.k = 60000 < 65504
    above = constant_qk(40.0, 40.0)  # q.k = 102400 > 65504: inf in float16
    for variant in ("math", "sdpa"):
        res = twin.run("attention", variant, "float16", below)
        assert not res.faults["nonfinite"] and not res.faults["precision_loss"], variant
    math_res = twin.run("attention", "math", "float16", above)
    sdpa_res = twin.run("attention", "sdpa", "float16", above)
    assert math_res.faults["nonfinite"] and torch.isnan(math_res.emulated).all()  # inf - inf in softmax
    assert not sdpa_res.faults["nonfinite"] and not sdpa_res.faults["precision_loss"]  # fp32 scores
    # The CPU production code shows the same split.
    assert torch.isnan(run_variant("attention", "math", "float16", above)).all()
    assert torch.isfinite(run_variant("attention", "sdpa", "float16", above)).all()
    # bfloat16 has float32's range: no overflow.
    bf = {k: v.to(torch.bfloat16) for k, v in above.items()}
    assert not twin.run("attention", "math", "bfloat16", bf).faults["nonfinite"]


@pytest.mark.parametrize(("sq", "sk"), [(8, 8), (12, 5), (5, 12)])
@pytest.mark.parametrize("variant", ["sdpa", "math"])
def test_causal_mask_top_left_aligned(variant: str, sq: int, sk: int) -> None:
    inputs = qkv(1, "float16", sq=sq, sk=sk)
    res = twin.run("attention", variant, "float16", inputs, {"causal": True})
    p = attention.reference_probabilities({k: v.double() for k, v in inputs.items()}, {"causal": True})
    assert p.shape == (1, 2, sq, sk)
    assert torch.equal(p[..., 0, 1:], torch.zeros_like(p[..., 0, 1:]))  # query 0 sees key 0 only
    assert torch.allclose(p.sum(-1), torch.ones(1, 2, sq, dtype=torch.float64))  # no empty row
    assert torch.equal(res.emulated[..., 0, :], inputs["v"][..., 0, :].double())  # p = 1 on key 0
    assert not res.faults["nonfinite"] and not res.faults["precision_loss"]
    # Causal differs from full attention, and the twin follows torch's masking on the CPU.
    full = twin.run("attention", variant, "float16", inputs, {"causal": False})
    assert not torch.equal(full.emulated, res.emulated)
    y = run_variant("attention", variant, "float16", inputs, {"causal": True}).double()
    assert float(ulps_between(res.emulated, y, "float16").max()) <= 1


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_math_matches_cpu_eager(dtype: str) -> None:
    # CPU eager attention has the spec's numerics step by step (fp32-accumulated matmuls rounded to
    # dtype, fp32-opmath scaling, torch softmax): float16/bfloat16 agree to the bit almost everywhere.
    inputs = qkv(2, dtype, sq=24, sk=40, d=64)
    y = run_variant("attention", "math", dtype, inputs).double()
    emu = twin.run("attention", "math", dtype, inputs).emulated
    ulps = ulps_between(emu, y, dtype)
    if dtype == "float32":
        assert float(ulps.max()) <= 8
    else:
        assert float(ulps.max()) <= 1 and float((ulps > 0).double().mean()) < 0.02


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_sdpa_close_to_cpu_sdpa(dtype: str) -> None:
    # CPU sdpa is a blocked online-softmax kernel, not the global-max model: within one ulp of dtype.
    inputs = qkv(3, dtype, sq=32, sk=48, d=64)
    y = run_variant("attention", "sdpa", dtype, inputs).double()
    emu = twin.run("attention", "sdpa", dtype, inputs).emulated
    ulps = ulps_between(emu, y, dtype)
    assert float(ulps.max()) <= (1 if dtype != "float32" else 16)
    assert float(ulps.mean()) < (0.2 if dtype != "float32" else 2.0)


def test_sdpa_more_accurate_than_math_in_float16() -> None:
    # Rounding scores and P to float16 costs math accuracy that sdpa keeps in fp32.
    inputs = qkv(4, "float16", sq=64, sk=64, d=64, scale=2.0, positive_v=False)
    e_sdpa = twin.run("attention", "sdpa", "float16", inputs).rel_error
    e_math = twin.run("attention", "math", "float16", inputs).rel_error
    assert e_sdpa < e_math


def test_low_entropy_peaked_vs_flat_scores() -> None:
    flat = qkv(5, "float16", scale=0.1)
    peaked = {k: v.clone() for k, v in flat.items()}
    # Key 3 aligned with every query with a large score gap: each row's weight sits on key 3.
    peaked["q"] = torch.full_like(flat["q"], 2.0)
    peaked["k"][..., 3, :] = 4.0  # score 2*4*32/sqrt(32) = 45 vs ~0 for the others
    assert not twin.run("attention", "sdpa", "float16", flat).faults["low_entropy"]
    r = twin.run("attention", "sdpa", "float16", peaked)
    assert r.faults["low_entropy"] and not r.faults["nonfinite"]


@pytest.mark.parametrize("noise", ["stochastic", "mca", "order"])
@pytest.mark.parametrize("variant", ["sdpa", "math"])
def test_replays_shape_seed_and_spread(variant: str, noise: str) -> None:
    inputs = qkv(6, "float32", sq=8, sk=96, d=16, positive_v=False)
    run = lambda seed: twin.run("attention", variant, "float32", inputs, {"causal": True}, noise=noise,
                                replays=5, seed=seed, keep_replays=True)
    a, b, c = run(1), run(1), run(2)
    assert a.replays.shape == (5, 1, 2, 8, 16)
    assert torch.equal(a.replays, b.replays)
    assert not torch.equal(a.replays, c.replays)
    assert not torch.equal(a.replays[0], a.replays[1])
    assert all(v.shape == (5,) for v in a.replay_faults.values())
    row0 = inputs["v"][..., 0, :].double().expand(5, 1, 2, 16)  # causal query 0 sees key 0 only: y = v0
    if noise == "mca":  # MCA perturbs exact operations too (exp(0) = 1 may become 1 - 2^-24)
        assert torch.allclose(a.replays[:, ..., 0, :], row0, rtol=4 * 2.0**-24, atol=0)
    else:
        assert torch.equal(a.replays[:, ..., 0, :], row0)
    assert float(a.replay_rel_error.max()) < 256 * 2.0**-24


def test_math_overflow_replays_all_fault() -> None:
    res = twin.run("attention", "math", "float16", constant_qk(40.0, 40.0), noise="stochastic", replays=8, seed=0)
    assert res.probability["nonfinite"] == 1.0
    res = twin.run("attention", "sdpa", "float16", constant_qk(40.0, 40.0), noise="mca", replays=8, seed=0)
    assert res.probability["nonfinite"] == 0.0


def test_reference_is_float64_attention() -> None:
    inputs = {k: v.double() for k, v in qkv(7, "float32", sq=5, sk=7, d=8).items()}
    s = inputs["q"] @ inputs["k"].transpose(-1, -2) / math.sqrt(8)
    want = torch.softmax(s, -1) @ inputs["v"]
    assert torch.allclose(attention.reference(inputs, {"causal": False}), want, rtol=0, atol=1e-15)
