"""matmul twin: float16 output overflow, fp32 accumulation loss, agreement with torch, replays.

    python -m pytest -q tests/test_twin_matmul.py
"""

from __future__ import annotations

import pytest
import torch

from optwin import twin
from optwin.kernels.production import run_variant
from optwin.twin import matmul
from optwin.twin.numerics import Numerics, ulps_between

DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def constant_product(entry_a: float, entry_b: float, k: int = 4, dtype: str = "float16") -> dict[str, torch.Tensor]:
    """a (2, k) of entry_a, b (k, 3) of entry_b: every output entry is k * entry_a * entry_b, exactly."""
    return {"a": torch.full((2, k), entry_a).to(DT[dtype]), "b": torch.full((k, 3), entry_b).to(DT[dtype])}


def test_float16_output_overflow_boundary() -> None:
    ok = twin.run("matmul", "torch", "float16", constant_product(250.0, 65.0))  # entries 65000
    bad = twin.run("matmul", "torch", "float16", constant_product(250.0, 66.0))  # entries 66000
    assert torch.equal(ok.exact, torch.full((2, 3), 65000.0, dtype=torch.float64))
    assert not ok.faults["nonfinite"] and not ok.faults["precision_loss"]
    assert bad.faults["nonfinite"] and torch.isinf(bad.emulated).all()
    # bfloat16 and float32 outputs hold 66000 easily; the fp32 accumulator never overflowed.
    for dtype in ("bfloat16", "float32"):
        res = twin.run("matmul", "torch", dtype, constant_product(250.0, 66.0, dtype=dtype))
        assert not res.faults["nonfinite"]
    # The CPU production code agrees on both sides.
    assert torch.isfinite(run_variant("matmul", "torch", "float16", constant_product(250.0, 65.0))).all()
    assert torch.isinf(run_variant("matmul", "torch", "float16", constant_product(250.0, 66.0))).all()


def cancelling(dtype: str, k: int = 96) -> dict[str, torch.Tensor]:
    """a @ b = 1e8 (chunk 0) + 1 (chunk 1) - 1e8 (chunk 2) = 1: the fp32 accumulator (spacing 8
    at 1e8) absorbs the 1 and the result is 0."""
    a = torch.zeros(1, k, dtype=torch.float64)
    b = torch.zeros(k, 1, dtype=torch.float64)
    a[0, 0], b[0, 0] = 1e4, 1e4  # chunk 0 (k 0..31)
    a[0, 40], b[40, 0] = 1.0, 1.0  # chunk 1
    a[0, 70], b[70, 0] = -1e4, 1e4  # chunk 2
    return {"a": a.to(DT[dtype]), "b": b.to(DT[dtype])}


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_fp32_accumulation_cancellation_is_precision_loss(dtype: str) -> None:
    inputs = cancelling(dtype)
    res = twin.run("matmul", "torch", dtype, inputs)
    assert float(res.exact[0, 0]) == 1.0 and float(res.emulated[0, 0]) == 0.0
    assert res.faults["precision_loss"] and not res.faults["nonfinite"]
    # Within one k-chunk the products are summed exactly: the same terms in one chunk lose nothing.
    a, b = inputs["a"].clone(), inputs["b"].clone()
    a[0, 40], b[40, 0], a[0, 70], b[70, 0] = 0, 0, 0, 0
    a[0, 1], b[1, 0], a[0, 2], b[2, 0] = 1.0, 1.0, -1e4, 1e4
    same_chunk = twin.run("matmul", "torch", dtype, {"a": a, "b": b})
    assert float(same_chunk.emulated[0, 0]) == 1.0 and not same_chunk.faults["precision_loss"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_benign_random_has_no_fault_and_format_sized_error(dtype: str) -> None:
    g = torch.Generator().manual_seed(1)
    inputs = {"a": torch.randn(32, 256, generator=g).to(DT[dtype]), "b": torch.randn(256, 24, generator=g).to(DT[dtype])}
    res = twin.run("matmul", "torch", dtype, inputs)
    assert not any(res.faults.values())
    u = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}[dtype]
    assert 0 < res.rel_error < 2 * u if dtype != "float32" else res.rel_error < 16 * u


@pytest.mark.parametrize(("dtype", "max_ulps", "mean_ulps"), [("float32", 4, 1.0), ("float16", 1, 0.05), ("bfloat16", 1, 0.05)])
def test_matches_cpu_torch_small_k(dtype: str, max_ulps: int, mean_ulps: float) -> None:
    # Positive entries: no cancellation, so ulps of the output measure the accumulation alone. The
    # twin rounds the exact 16-term sum once; the CPU GEMM chains 16 fp32 FMAs (a few ulps at most).
    g = torch.Generator().manual_seed(2)
    inputs = {"a": torch.rand(48, 16, generator=g).to(DT[dtype]), "b": torch.rand(16, 40, generator=g).to(DT[dtype])}
    y = run_variant("matmul", "torch", dtype, inputs).double()
    emu = twin.run("matmul", "torch", dtype, inputs).emulated
    ulps = ulps_between(emu, y, dtype)
    assert float(ulps.max()) <= max_ulps
    assert float(ulps.mean()) < mean_ulps


def test_stochastic_output_rounding_overflow_probability() -> None:
    # Every entry is 256 * 255 + 232 * 1 = 65512 exactly: round-to-nearest gives 65504, stochastic
    # rounding goes up to 65536 (> max: inf) with probability (65512 - 65504) / 32 = 1/4.
    a = torch.tensor([[256.0, 232.0]] * 2).half()  # (2, 2)
    b = torch.tensor([[255.0], [1.0]]).half()  # (2, 1)
    det = twin.run("matmul", "torch", "float16", {"a": a, "b": b})
    assert not det.faults["nonfinite"] and float(det.emulated[0, 0]) == 65504.0
    res = twin.run("matmul", "torch", "float16", {"a": a, "b": b}, noise="stochastic", replays=600, seed=3)
    p = res.probability["nonfinite"]
    expected = 1 - 0.75**2  # two independent entries, either overflowing faults the replay
    assert abs(p - expected) < 0.07, p
    # mca perturbs by up to half an ulp at 2^-11 relative: 65512 +- 16 crosses 65520 a quarter of the time
    mca = twin.run("matmul", "torch", "float16", {"a": a, "b": b}, noise="mca", replays=600, seed=3)
    assert 0.2 < mca.probability["nonfinite"] < 0.7


@pytest.mark.parametrize("noise", ["stochastic", "mca", "order"])
def test_replays_shape_seed_and_spread(noise: str) -> None:
    g = torch.Generator().manual_seed(4)
    inputs = {"a": torch.randn(16, 512, generator=g), "b": torch.randn(512, 8, generator=g)}
    run = lambda seed: twin.run("matmul", "torch", "float32", inputs, noise=noise, replays=6, seed=seed,
                                keep_replays=True)
    a, b, c = run(5), run(5), run(6)
    assert a.replays.shape == (6, 16, 8)
    assert torch.equal(a.replays, b.replays)
    assert not torch.equal(a.replays, c.replays)
    assert not torch.equal(a.replays[0], a.replays[1])  # each replay its own rounding / order
    assert all(v.shape == (6,) for v in a.replay_faults.values())
    assert float(a.replay_rel_error.max()) < 64 * 2.0**-24


def test_replay_broadcast_inputs_match_materialised_inputs() -> None:
    # A replay-expanded input is multiplied once; a materialised copy must give the same replays.
    g = torch.Generator().manual_seed(5)
    a = torch.randn(8, 100, generator=g).half().double()
    b = torch.randn(100, 5, generator=g).half().double()
    for noise in ("stochastic", "order", "none"):
        n1, n2 = Numerics(noise, 4, seed=9), Numerics(noise, 4, seed=9)
        y1 = matmul.twin(n1, "torch", "float16", {"a": n1.expand(a), "b": n1.expand(b)}, {})
        y2 = matmul.twin(n2, "torch", "float16", {"a": n2.expand(a).clone(), "b": n2.expand(b).clone()}, {})
        assert y1.shape == y2.shape == (4, 8, 5)
        if noise != "stochastic":  # same draws only where no noise is drawn per product element
            assert torch.equal(y1, y2)
        det = matmul.twin(Numerics(), "torch", "float16", {"a": a, "b": b}, {})
        assert float((y1 - det).abs().max()) <= float(det.abs().max()) * 2.0**-9


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32"])
def test_fast_stochastic_rounding_agrees_with_the_scaled_path(name: str) -> None:
    # The replays' bit-arithmetic stochastic rounding (numerics.round_stochastic) against the
    # general ulp-scaling path: same two neighbours, same up-probability, for normals, subnormals,
    # the overflow edge, zeros, infinities and NaN, mixed in one tensor.
    from optwin.twin.numerics import FORMATS, _round_stochastic_scaled, round_stochastic

    f = FORMATS[name]
    vals = [f.max * (1 + 2.0 ** -(f.p + 1)), -1.3 * f.tiny * 2.0**-3, 1 + 0.3 * 2.0 ** (1 - f.p), 0.0, -0.0,
            float("inf"), float("nan"), -f.tiny * (1 - 2.0**-12)]
    n = 20000
    x = torch.tensor(vals, dtype=torch.float64).repeat(n, 1)  # (n, 8)
    fast = round_stochastic(x, f, torch.Generator().manual_seed(1))
    ref = _round_stochastic_scaled(x, f, torch.Generator().manual_seed(2), False)
    for j in range(len(vals)):
        a, b = fast[:, j], ref[:, j]
        assert set(a[~torch.isnan(a)].tolist()) == set(b[~torch.isnan(b)].tolist()), vals[j]
        assert torch.isnan(a).all() == torch.isnan(b).all()
        assert torch.equal(torch.signbit(a), torch.signbit(b))
        fa, fb = torch.isfinite(a), torch.isfinite(b)
        assert abs(float(fa.double().mean()) - float(fb.double().mean())) < 0.03
        if fa.any() and fb.any():
            spread = float((b[fb].max() - b[fb].min()).abs())
            assert abs(float(a[fa].mean()) - float(b[fb].mean())) <= 0.03 * spread + 1e-300
