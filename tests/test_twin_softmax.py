"""softmax twin: fault boundaries where the formats put them, agreement with torch, noisy replays.

    python -m pytest -q tests/test_twin_softmax.py
"""

from __future__ import annotations

import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest
import torch

from optwin import twin
from optwin.kernels.production import run_variant
from optwin.kernels.softmax import softmax as triton_softmax
from optwin.twin import softmax
from optwin.twin.numerics import Numerics, ulps_between

DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def row_with_max(top: float, dtype: str, n: int = 8) -> torch.Tensor:
    """One row: `top` once, small values elsewhere (the sum stays below the top's own overflow)."""
    x = torch.linspace(-2.0, 0.0, n, dtype=torch.float64)
    x[3] = top
    return x.unsqueeze(0).to(DT[dtype])  # (1, n)


@pytest.mark.parametrize(("dtype", "below", "above"), [
    ("float16", 11.0, 11.2),  # ln(65504) = 11.09
    ("bfloat16", 88.5, 89.0),  # ln(bf16 max 3.39e38) = 88.72; bf16 spacing at 88 is 0.5
    ("float32", 88.7, 88.75),  # ln(fp32 max) = 88.72
])
def test_naive_overflow_boundary(dtype: str, below: float, above: float) -> None:
    ok = twin.run("softmax", "naive", dtype, {"x": row_with_max(below, dtype)})
    bad = twin.run("softmax", "naive", dtype, {"x": row_with_max(above, dtype)})
    assert not ok.faults["nonfinite"] and not ok.faults["precision_loss"]
    assert bad.faults["nonfinite"]
    assert torch.isnan(bad.emulated).any()  # exp(x) = inf, inf / inf = NaN
    # The max-subtracting variants never overflow, even far beyond the boundary.
    for variant in ("torch", "triton"):
        far = twin.run("softmax", variant, dtype, {"x": row_with_max(above * 4, dtype)})
        assert not far.faults["nonfinite"] and not far.faults["precision_loss"]


def test_naive_float16_sum_overflow_is_precision_loss_not_nan() -> None:
    # Each exp(11.0) = 59874 fits float16, their float32 sum 119748 does not: s rounds to inf,
    # y = e / inf = 0 everywhere -- finite but all probability lost.
    x = torch.tensor([[11.0, 11.0, 0.0, 0.0]], dtype=torch.float16)
    res = twin.run("softmax", "naive", "float16", {"x": x})
    assert not res.faults["nonfinite"] and res.faults["precision_loss"]
    assert torch.equal(res.emulated, torch.zeros_like(res.emulated))
    # The production code on the CPU does the same.
    assert torch.equal(run_variant("softmax", "naive", "float16", {"x": x}).double(), res.emulated)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_fully_masked_row_is_nonfinite(dtype: str) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 16, generator=g, dtype=torch.float64)
    x[1] = -math.inf  # fully masked
    x[2, :8] = -math.inf  # half masked: fine
    x = x.to(DT[dtype])
    exact = softmax.reference({"x": x.double()}, {})
    assert torch.isnan(exact[1]).all() and torch.isfinite(exact[[0, 2, 3]]).all()
    for variant in ("torch", "naive", "triton"):
        res = twin.run("softmax", variant, dtype, {"x": x})
        assert res.faults["nonfinite"], variant
        assert torch.isnan(res.emulated[1]).all(), variant
        assert torch.isfinite(res.emulated[[0, 2, 3]]).all(), variant
        assert torch.equal(res.emulated[2, :8], torch.zeros(8, dtype=torch.float64))
    # Without the masked row nothing faults: the other rows are judged on their own.
    ok = twin.run("softmax", "torch", dtype, {"x": x[[0, 2, 3]]})
    assert not any(ok.faults.values())


def test_torch_masked_row_matches_production_nan() -> None:
    x = torch.full((2, 8), -math.inf, dtype=torch.float16)
    x[0, 0] = 1.0
    y = run_variant("softmax", "torch", "float16", {"x": x})
    res = twin.run("softmax", "torch", "float16", {"x": x})
    assert torch.isnan(y[1]).all() and torch.isnan(res.emulated[1]).all()
    assert torch.equal(res.emulated[0], y[0].double())


def test_low_entropy_peaked_vs_flat() -> None:
    g = torch.Generator().manual_seed(2)
    flat = (torch.randn(8, 64, generator=g) * 0.1).half()
    peaked = flat.clone()
    peaked[:, 5] = 20.0  # logit gap 20: all mass on one position, entropy ~ 64 e^-20 * 21 nats
    r_flat = twin.run("softmax", "torch", "float16", {"x": flat})
    r_peak = twin.run("softmax", "torch", "float16", {"x": peaked})
    assert not r_flat.faults["low_entropy"] and r_peak.faults["low_entropy"]
    # "more than half the rows": 4 peaked rows of 8 is not enough, 5 is.
    half = flat.clone()
    half[:4, 5] = 20.0
    assert not twin.run("softmax", "torch", "float16", {"x": half}).faults["low_entropy"]
    half[4, 5] = 20.0
    assert twin.run("softmax", "torch", "float16", {"x": half}).faults["low_entropy"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_torch_variant_matches_cpu_torch_softmax(dtype: str) -> None:
    # CPU torch.softmax has the spec's semantics (fp32 inside, max subtracted, one rounding to dtype).
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(16, 300, generator=g) * 4).to(DT[dtype])
    x[3, 100:] = -math.inf
    y = run_variant("softmax", "torch", dtype, {"x": x}).double()
    emu = twin.run("softmax", "torch", dtype, {"x": x}).emulated
    ulps = ulps_between(emu, y, dtype)
    # CPU exp (Sleef, ~1 ulp), its sum order and its multiply-by-reciprocal move the fp32 value by
    # a few fp32 ulps: at most one ulp of float16/bfloat16, and then only rarely.
    if dtype == "float32":
        assert float(ulps.max()) <= 8
    else:
        assert float(ulps.max()) <= 1 and float((ulps > 0).double().mean()) < 0.05


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_naive_variant_matches_cpu_production(dtype: str) -> None:
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(16, 512, generator=g) * 3).to(DT[dtype])
    y = run_variant("softmax", "naive", dtype, {"x": x}).double()
    emu = twin.run("softmax", "naive", dtype, {"x": x}).emulated
    # The twin sums as torch's CUDA reduce does (checked on an H100: tests/test_twin_s49_cuda_reduce.py); CPU torch
    # sums in its own order and its exp is ~1 ulp off: a few float32 ulps apart, as the torch variant's above.
    assert float(ulps_between(emu, y, dtype).max()) <= 8


def test_emulation_error_is_format_sized() -> None:
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(8, 1024, generator=g) * 3).half()
    res = twin.run("softmax", "torch", "float16", {"x": x})
    assert 0 < res.rel_error < 2 * 2.0**-11  # one rounding to float16 dominates
    res32 = twin.run("softmax", "torch", "float32", {"x": x.float()})
    assert 0 < res32.rel_error < 8 * 2.0**-24


@pytest.mark.parametrize("noise", ["stochastic", "mca", "order"])
def test_replays_shape_seed_and_spread(noise: str) -> None:
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(4, 2048, generator=g) * 3).float()
    run = lambda seed: twin.run("softmax", "triton", "float32", {"x": x}, noise=noise, replays=8, seed=seed,
                                keep_replays=True)
    a, b, c = run(0), run(0), run(1)
    assert a.replays.shape == (8, 4, 2048)
    assert torch.equal(a.replays, b.replays)  # reproducible for a seed
    assert not torch.equal(a.replays, c.replays)  # another seed, other replays
    assert not torch.equal(a.replays[0], a.replays[1])  # replays differ from each other
    assert a.replay_rel_error.shape == (8,)
    assert all(v.shape == (8,) for v in a.replay_faults.values())
    # Noise is format-sized: every replay stays within a few fp32 roundings of the reference.
    assert float(a.replay_rel_error.max()) < 64 * 2.0**-24


def test_stochastic_naive_sum_overflow_has_a_probability() -> None:
    # exp(11.0859375) = 65247.1 -> 65248 and exp(5.57421875) = 263.54 -> 263.5 in float16: their float32
    # sum 65511.5 rounds to nearest 65504 (finite), but stochastic rounding sends it up to inf with
    # probability ~ (65511.5 - 65504) / 32 = 0.23; then y = e / inf = 0: precision loss, not NaN.
    x = torch.tensor([[11.0859375, 5.57421875]], dtype=torch.float16)
    det = twin.run("softmax", "naive", "float16", {"x": x})
    assert not det.faults["precision_loss"] and not det.faults["nonfinite"]
    res = twin.run("softmax", "naive", "float16", {"x": x}, noise="stochastic", replays=400, seed=7)
    p = res.probability["precision_loss"]
    assert 0.15 < p < 0.35, p
    assert res.probability["nonfinite"] == 0.0
    mca = twin.run("softmax", "naive", "float16", {"x": x}, noise="mca", replays=400, seed=7)
    assert 0.05 < mca.probability["precision_loss"] < 0.5


def test_unknown_variant_in_module_raises() -> None:
    with pytest.raises(ValueError, match="softmax"):
        softmax.twin(Numerics(), "nope", "float16", {"x": torch.zeros(1, 2, dtype=torch.float64)}, {})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_triton_flushes_subnormal_probabilities_as_its_kernel_does(dtype: str) -> None:
    # exp(-90) = 8.2e-40 is a float32 (and bfloat16) subnormal: torch keeps it, our kernel's ex2.approx.ftz gives 0
    # (the interpreter flushes numpy's exp the same way), and the triton twin models the flush.
    x = torch.tensor([[0.0, -90.0, -50.0]]).to(DT[dtype])
    kernel, _ = triton_softmax(x, sketch=False)
    emu = twin.run("softmax", "triton", dtype, {"x": x}).emulated
    torch_y = run_variant("softmax", "torch", dtype, {"x": x}).double()
    assert float(torch_y[0, 1]) > 0  # subnormal, not flushed
    assert float(kernel[0, 1]) == 0 and float(emu[0, 1]) == 0
    # exp(-50) = 2e-22 is normal: kept by both. Not bit for bit: the interpreter's exp2 is numpy's float32 SIMD
    # one, whose last bit depends on the CPU's path (on an AVX-512 Sapphire Rapids host 1 ulp off the correctly
    # rounded value the twin takes; the GPU's ex2.approx is checked against the twin in bench/gpu_twin.py)
    got, want = float(kernel[0, 2].double()), float(emu[0, 2])
    assert want > 0 and abs(got - want) <= want * 2.0**-23


def test_triton_exp_is_ex2_of_the_rounded_product() -> None:
    # the kernels take exp(d) as ex2.approx(fp32(d * fp32(log2 e))): at d ~ -40 the product's rounding
    # moves exp by tens of float32 ulps from exp(d) itself (H200, 8x128256 float32: 32.1 -> 2.1 ulps
    # between kernel and twin once the twin took the product, bench/results/softmax_online_*_s23c.md)
    x = torch.tensor([[0.0, -40.123456789]], dtype=torch.float64).float()
    emu = twin.run("softmax", "triton", "float32", {"x": x}).emulated
    d = float(x[0, 1])
    product = float(torch.tensor(d * softmax.LOG2E_F32, dtype=torch.float64).float())
    assert float(emu[0, 1]) * float(emu[0, 0].double().reciprocal()) == pytest.approx(2.0**product, rel=2**-23)
    assert abs(float(emu[0, 1]) / math.exp(d) - 1) > 4 * 2**-24  # not exp(d) rounded: many ulps away


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_triton_rows_past_the_register_limit_take_piece_sums(dtype: str) -> None:
    # rows past TRITON_WHOLE_ROW_MAX: optwin.kernels.softmax_long's sums over 4096-wide pieces, then across them
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(4, 70001, generator=g) * 5).to(DT[dtype])
    x[1, ::3] = -float("inf")
    x[2, :66000] = -float("inf")  # pieces of only -inf
    emu = twin.run("softmax", "triton", dtype, {"x": x[:3]}).emulated  # the twin takes finite inputs and masks
    ref = torch.softmax(x[:3].double(), -1)
    tol = {"float16": (2e-3, 1e-7), "float32": (1e-5, 2e-38)}[dtype]  # float16 flushes below its subnormals
    torch.testing.assert_close(emu, ref, rtol=tol[0], atol=tol[1])
    kernel, _ = triton_softmax(x, sketch=False)
    assert torch.equal(kernel[:3].double(), emu) or dtype == "float32"  # float32: numpy's exp2 last bits
    x[3, 7] = float("nan")  # the max passes over it; its piece's sum is NaN
    kernel, _ = triton_softmax(x, sketch=False)
    assert bool(kernel[3].isnan().all())  # the row's sum is NaN, as torch.softmax's row is
