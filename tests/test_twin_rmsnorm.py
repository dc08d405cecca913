"""rmsnorm twin: the native-dtype float16 fault boundary at |x| = 256, fp32-acc clean, replays.

    python -m pytest -q tests/test_twin_rmsnorm.py
"""

from __future__ import annotations

import torch

from optwin import twin
from optwin.kernels.production import run_variant
from optwin.twin.numerics import ulps_between


def _case(absmax: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """Rows of N(0, 30) with one element per row pinned at +-absmax (float16)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(4, 64, generator=g, dtype=torch.float64) * 30).clamp(-200, 200)
    x[:, 5] = absmax
    x[1, 9] = -absmax
    return {"x": x.half(), "weight": (1 + 0.1 * torch.randn(64, generator=g)).half()}


def test_native_dtype_float16_faults_past_256_and_fp32_acc_stays_clean() -> None:
    below, above = _case(255.0), _case(257.0)  # 255^2 = 65025 < 65504 < 257^2 = 66049
    assert not any(twin.run("rmsnorm", "native-dtype", "float16", below).faults.values())
    faults = twin.run("rmsnorm", "native-dtype", "float16", above).faults
    assert faults["precision_loss"] or faults["nonfinite"]
    for case in (below, above):
        assert not any(twin.run("rmsnorm", "fp32-acc", "float16", case).faults.values())


def test_twin_tracks_cpu_production() -> None:
    # CPU torch's half rsqrt is not correctly rounded (1 ulp off near ties), so rows can differ by
    # a few ulps; the GPU computes rsqrtf in float32 like the twin.
    for absmax in (100.0, 255.0, 257.0):
        inp = _case(absmax, seed=int(absmax))
        for variant in ("fp32-acc", "native-dtype"):
            res = twin.run("rmsnorm", variant, "float16", inp)
            y = run_variant("rmsnorm", variant, "float16", inp).double()
            u = ulps_between(res.emulated, y, "float16")
            assert u.median().item() <= 0.5 and u.max().item() <= 4, (variant, absmax, u.max().item())


def test_noisy_replays_agree_away_from_the_boundary() -> None:
    # Rounding noise moves results by ulps: far from the boundary every replay keeps the outcome.
    for noise in ("stochastic", "mca", "order"):
        clean = twin.run("rmsnorm", "native-dtype", "float16", _case(100.0), noise=noise, replays=16, seed=1)
        over = twin.run("rmsnorm", "native-dtype", "float16", _case(300.0), noise=noise, replays=16, seed=1)
        assert clean.replay_faults["precision_loss"].shape == (16,)
        assert clean.probability == {"nonfinite": 0.0, "precision_loss": 0.0}, noise
        assert over.probability["precision_loss"] + over.probability["nonfinite"] == 1.0, noise
        assert clean.replay_rel_error.unique().numel() > 1 or noise == "order"


def test_eps_is_added_as_a_float32_scalar() -> None:
    """`v + eps` with v a float32 tensor (every variant's mean square is one) adds eps rounded to float32
    (torch casts the Python scalar to the op's float32 type; the Triton kernel takes it as an fp32
    argument). Rows of one element make v = fp32(x*x) in [0, 4e-6], where fp32(v + 1e-6) and
    fp32(v + fp32(1e-6)) part for a few percent of the rows: the twin must follow torch's float32 add."""
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(4096, 1, generator=g) * 2e-3).float()  # (rows, 1) float32
    v = x * x  # (rows, 1) the mean square, float32
    def y(v_eps: torch.Tensor) -> torch.Tensor:  # x * rsqrt(v + eps), rsqrt rounded once to float32
        return (x.double() * torch.rsqrt(v_eps.double()).float().double()).float().double()
    want = y(v + 1e-6)  # torch's float32 tensor + Python scalar
    assert not torch.equal(y((v.double() + 1e-6).float()), want)  # the float64 eps would differ
    for variant in ("fp32-acc", "native-dtype", "triton"):
        res = twin.run("rmsnorm", variant, "float32", {"x": x, "weight": torch.ones(1)})
        assert torch.equal(res.emulated, want), variant
