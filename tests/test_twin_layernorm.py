"""layernorm twin: one-pass variance cancels around |mean|/std ~ 2^12 (float16) and far earlier
against float32's tolerance; the two-pass/Welford statistics stay clean.

    python -m pytest -q tests/test_twin_layernorm.py
"""

from __future__ import annotations

import pytest
import torch

from optwin import twin
from optwin.kernels.production import run_variant
from optwin.twin import layernorm
from optwin.twin.numerics import Numerics, ulps_between


def _case(mean: float, std: float, dtype: torch.dtype, seed: int = 0, hidden: int = 128) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (mean + std * torch.randn(4, hidden, generator=g, dtype=torch.float64)).to(dtype)
    return {"x": x, "weight": (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype),
            "bias": (0.1 * torch.randn(hidden, generator=g)).to(dtype)}


def _ratio(inp: dict[str, torch.Tensor]) -> float:
    """max over rows of |mean| / std of the dtype-rounded input (the sketch's feature)."""
    x = inp["x"].double()
    return (x.mean(-1).abs() / x.std(-1, unbiased=False)).max().item()


def _faulty(variant: str, dtype: str, inp: dict[str, torch.Tensor]) -> bool:
    return any(twin.run("layernorm", variant, dtype, inp).faults.values())


def test_reference_is_population_layer_norm() -> None:
    inp = _case(3.0, 2.0, torch.float32, seed=1)
    x = inp["x"].double()
    want = torch.nn.functional.layer_norm(x, (x.shape[-1],), inp["weight"].double(), inp["bias"].double(), 1e-5)
    assert torch.allclose(layernorm.reference(twin.to_float64(inp), {}), want, rtol=0, atol=1e-12)


def test_float16_one_pass_faults_past_2_to_the_10_while_torch_stays_clean() -> None:
    below = _case(64.0, 1.0, torch.float16)  # |mean|/std ~ 2^6
    above = _case(2048.0, 2.0, torch.float16)  # float16 spacing at 2048 is 2: |mean|/std ~ 2^10.5
    assert 2**5 < _ratio(below) < 2**7 and _ratio(above) > 2**10
    assert not _faulty("one-pass", "float16", below)
    assert _faulty("one-pass", "float16", above)
    for inp in (below, above):
        assert not _faulty("torch", "float16", inp)
        assert not _faulty("triton", "float16", inp)


def test_float32_one_pass_cancels_catastrophically_near_2_to_the_12() -> None:
    # float32's tau (16 u) is tight: one-pass already exceeds it at |mean|/std ~ 4, and any variant
    # does once |mean|/std ~ 16 (the rounded mean alone shifts (h - m) by ~2^-24 |mean|). At
    # 2^12 one-pass loses everything (or goes NaN through a negative variance).
    clean = _case(0.5, 1.0, torch.float32)
    assert not _faulty("one-pass", "float32", clean) and not _faulty("torch", "float32", clean)
    assert _faulty("one-pass", "float32", _case(16.0, 1.0, torch.float32))
    for seed in range(3):
        far = _case(2.0**13, 1.0, torch.float32, seed=seed)
        one = twin.run("layernorm", "one-pass", "float32", far)
        torch_var = twin.run("layernorm", "torch", "float32", far)
        assert one.faults["nonfinite"] or one.rel_error > 0.1
        assert torch_var.rel_error < 1e-3 and not torch_var.faults["nonfinite"]


@pytest.mark.parametrize("variant", ["torch", "one-pass"])
@pytest.mark.parametrize("dtype,mean", [("float16", 3.0), ("bfloat16", 3.0), ("float32", 0.0), ("float16", 0.5)])
def test_twin_tracks_cpu_production(variant: str, dtype: str, mean: float) -> None:
    inp = _case(mean, 1.0, getattr(torch, dtype), seed=5)
    res = twin.run("layernorm", variant, dtype, inp)
    y = run_variant("layernorm", variant, dtype, inp).double()
    u = ulps_between(res.emulated, y, dtype)
    # The CPU reduces in its own order: low-precision outputs agree nearly everywhere, float32 within ulps.
    assert u.median().item() <= (2 if dtype == "float32" else 0), u.median().item()
    assert (u <= 1).double().mean().item() > (0.5 if dtype == "float32" else 0.95)


@pytest.mark.parametrize("dtype,mean", [("float32", 8.0), ("float32", 40.0), ("float16", 500.0)])
def test_ill_conditioned_one_pass_errors_match_cpu_production(dtype: str, mean: float) -> None:
    # Where E[h^2] - E[h]^2 cancels, the variance's last bits depend on the reduction order, so the
    # outputs differ by a row-wide offset; the size of the error matches.
    inp = _case(mean, 1.0, getattr(torch, dtype), seed=6)
    res = twin.run("layernorm", "one-pass", dtype, inp)
    y = run_variant("layernorm", "one-pass", dtype, inp).double()
    prod_rel = ((y - res.exact).norm() / res.exact.norm()).item()
    assert 0.25 < res.rel_error / prod_rel < 4, (res.rel_error, prod_rel)


def test_replays_judge_the_boundary_per_replay() -> None:
    inp = _case(2048.0, 2.0, torch.float16)
    res = twin.run("layernorm", "one-pass", "float16", inp, noise="order", replays=16, seed=3)
    assert res.replay_faults["precision_loss"].shape == (16,)
    assert res.probability["precision_loss"] + res.probability["nonfinite"] > 0.5
    res = twin.run("layernorm", "torch", "float16", inp, noise="mca", replays=16, seed=3)
    assert res.probability == {"nonfinite": 0.0, "precision_loss": 0.0}


def test_welford_statistics_keep_constant_rows_exact() -> None:
    # A float16 row at |mean|/std = inf (all equal after rounding): Welford's deltas are all 0, so the
    # GPU's mean is exact and y = bias, where sum / n would leave a residue that rsqrt(eps) blows up.
    c = torch.full((2, 96), 12345.678, dtype=torch.float64).float().double()
    m, v = layernorm.rowwise_welford(Numerics(), c)
    assert torch.equal(m.squeeze(-1), c[:, 0]) and torch.equal(v, torch.zeros_like(v))
    g = torch.Generator().manual_seed(8)
    h = (5 + torch.randn(3, 300, generator=g, dtype=torch.float64)).float().double()
    m, v = layernorm.rowwise_welford(Numerics(), h)
    assert torch.allclose(m.squeeze(-1), h.mean(-1), rtol=4e-7, atol=0)
    assert torch.allclose(v.squeeze(-1), h.var(-1, unbiased=False), rtol=1e-6, atol=0)
    inp = {"x": torch.full((2, 96), 3001.0, dtype=torch.float16), "weight": torch.ones(96, dtype=torch.float16),
           "bias": torch.full((96,), 0.5, dtype=torch.float16)}
    res = twin.run("layernorm", "torch", "float16", inp)
    assert torch.equal(res.emulated, torch.full((2, 96), 0.5, dtype=torch.float64)) and not any(res.faults.values())


def test_mca_keeps_a_constant_row_exact() -> None:
    """A constant float16 row of 0.5: every step of F.layer_norm is exact (mean 0.5, deltas 0, y = bias),
    so Verificarlo's random rounding has nothing to perturb and no replay may fault. Perturbing exact
    results first gave precision_loss in every replay under mca where stochastic rounding gave none."""
    inp = {"x": torch.full((4, 256), 0.5).half(), "weight": torch.ones(256).half(), "bias": torch.zeros(256).half()}
    for noise in ("mca", "stochastic"):
        res = twin.run("layernorm", "torch", "float16", inp, noise=noise, replays=32, seed=0)
        assert res.probability == {"nonfinite": 0.0, "precision_loss": 0.0}, noise


def test_welford_lane_constants_are_rounded_per_replay(monkeypatch) -> None:
    """The Welford tree's per-lane constants (nb / (na + nb), 128 lanes) are rounded once per replay,
    with the replay dim: a tensor of 128 lanes without it looked like a batch of 128 replays to the
    per-replay generators, so 128 replays run at once and the same replays run in batches of 64 drew
    differently. Any split of the replays must give the unbatched run's replays."""
    inp = _case(3.0, 2.0, torch.float16, seed=4, hidden=256)
    whole = twin.run("layernorm", "torch", "float16", inp, noise="stochastic", replays=128, seed=2, keep_replays=True)
    x = twin.to_float64(inp)
    monkeypatch.setattr(twin, "REPLAY_BATCH_BYTES", 64 * twin.replay_bytes(x, layernorm.reference(x, {}), None))
    part = twin.run("layernorm", "torch", "float16", inp, noise="stochastic", replays=128, seed=2, keep_replays=True)
    assert torch.equal(part.replays, whole.replays)
    assert whole.replays.unique(dim=0).shape[0] > 1
