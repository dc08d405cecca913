"""rope twin: low-precision-angles faults past float16's exact integers (2048) and its range (65504);
fp32-angles stays clean; the twin tracks the production code.

    python -m pytest -q tests/test_twin_rope.py
"""

from __future__ import annotations

import math

import pytest
import torch

from optwin import twin
from optwin.errors import CatalogError, InputError
from optwin.kernels.production import run_variant
from optwin.twin import rope
from optwin.twin.faults import fault_flags
from optwin.twin.numerics import Numerics, ulps_between


def _case(lo: int, hi: int, dtype: torch.dtype = torch.float16, seed: int = 0, seq: int = 8) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(lo, hi + 1, (seq,), generator=g)
    return {"x": torch.randn(seq, 2, 32, generator=g).to(dtype), "positions": pos}


def _faults(variant: str, inp: dict[str, torch.Tensor], dtype: str = "float16") -> dict[str, bool]:
    return twin.run("rope", variant, dtype, inp).faults


def test_reference_matches_rotation_of_pairs() -> None:
    # Independent float64 form: rotate each (x_i, x_{i+d/2}) pair by angle pos * base^(-2i/d).
    inp = twin.to_float64(_case(0, 5000, torch.float32, seed=1))
    x, pos = inp["x"], inp["positions"]
    d = x.shape[-1]
    theta = pos[:, None] * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (seq, d/2)
    c, s = theta.cos()[:, None, :], theta.sin()[:, None, :]
    a, b = x[..., : d // 2], x[..., d // 2:]
    want = torch.cat((a * c - b * s, b * c + a * s), dim=-1)
    assert torch.allclose(rope.reference(inp, {"base": 10000.0}), want, rtol=0, atol=1e-12)


def test_low_precision_angles_float16_boundaries() -> None:
    assert not any(_faults("low-precision-angles", _case(0, 4)).values())  # tiny positions: clean
    for lo, hi in ((2049, 4000), (4001, 30000), (30000, 65000)):  # past exact integers: angles drift
        f = _faults("low-precision-angles", _case(lo, hi, seed=lo))
        assert f == {"nonfinite": False, "precision_loss": True}, (lo, hi)
    inp = _case(0, 100)
    inp["positions"][3] = 70000  # past 65504: the float16 position is inf, cos(inf) = NaN
    assert _faults("low-precision-angles", inp)["nonfinite"]


@pytest.mark.parametrize("lo,hi", [(0, 64), (0, 2048), (2049, 65000)])
def test_fp32_angles_float16_clean(lo: int, hi: int) -> None:
    inp = _case(lo, hi, seed=hi)
    assert not any(_faults("fp32-angles", inp).values())
    assert not any(_faults("triton", inp).values())


def test_noise_keeps_far_outcomes_and_overflow_is_certain() -> None:
    inp = _case(0, 100)
    inp["positions"][0] = 100000
    for noise in ("stochastic", "mca"):
        res = twin.run("rope", "low-precision-angles", "float16", inp, noise=noise, replays=8, seed=2)
        assert res.probability["nonfinite"] == 1.0
        res = twin.run("rope", "fp32-angles", "float16", _case(0, 64), noise=noise, replays=8, seed=2)
        assert res.probability == {"nonfinite": 0.0, "precision_loss": 0.0}
        assert res.replay_rel_error.unique().numel() > 1


@pytest.mark.parametrize("variant", ["fp32-angles", "low-precision-angles"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_twin_tracks_cpu_production(variant: str, dtype: str) -> None:
    inp = _case(0, 3000, getattr(torch, dtype), seed=3, seq=16)
    res = twin.run("rope", variant, dtype, inp)
    y = run_variant("rope", variant, dtype, inp).double()
    u = ulps_between(res.emulated, y, dtype)
    # CPU sinf/cosf (SLEEF) are within 1 ulp, not correctly rounded: most elements agree bit for bit.
    assert (u == 0).double().mean().item() > 0.9 and u.median().item() == 0, (u.max().item())
    gpu_like = {k: bool(v) for k, v in fault_flags("rope", dtype, y, res.exact).items()}
    assert gpu_like == res.faults


def test_inv_freq_is_float32_as_torch_computes_it() -> None:
    for d in (16, 64, 128):
        want = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        got = rope.inv_freq(Numerics(), d, 10000.0)
        assert (ulps_between(got, want.double(), "float32") <= 1).all()
        assert math.isclose(got[0].item(), 1.0)


def test_numpy_float_bases_are_bases() -> None:
    """A numpy float base (np.float32 as well as np.float64, a float subclass) is a base like the
    Python float of the same value, where np.float32(10000) was refused as not a number."""
    np = pytest.importorskip("numpy")
    inp = _case(0, 5000, torch.float32, seed=2)
    want = twin.run("rope", "fp32-angles", "float32", inp, params={"base": 10000.0})
    for base in (np.float32(10000), np.float64(10000), np.int64(10000), 10000):
        got = twin.run("rope", "fp32-angles", "float32", inp, params={"base": base})
        assert torch.equal(got.emulated, want.emulated) and torch.equal(got.exact, want.exact), type(base)
    for bad in (np.float32("inf"), np.float32(1.0), np.bool_(True), 10**400):
        with pytest.raises(CatalogError, match="^rope: param base must be a finite number > 1"):
            twin.run("rope", "fp32-angles", "float32", inp, params={"base": bad})


def test_positions_past_float64_integers_are_refused() -> None:
    """The reference rotates by exact integer positions in float64, which holds integers exactly only
    below 2^53: a position at or past it (either sign, int64's -2^63 too) is one InputError line, where
    2^60 + 1 was silently rounded to 2^60 and judged as a precision_loss fault."""
    x = torch.randn(2, 1, 4)
    for bad in (2**53, -(2**53), 2**60 + 1, -(2**63)):
        with pytest.raises(InputError) as e:
            twin.run("rope", "fp32-angles", "float32", {"x": x, "positions": torch.tensor([bad, 3])})
        assert str(e.value).startswith("rope: input 'positions'") and "2^53" in str(e.value) and "\n" not in str(e.value)
    edge = torch.tensor([2**53 - 1, -(2**53 - 1)])
    res = twin.run("rope", "fp32-angles", "float32", {"x": x, "positions": edge})
    assert torch.equal(twin.to_float64({"p": edge})["p"].long(), edge) and res.exact.shape == x.shape
