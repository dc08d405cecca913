"""mca noise below the emulated format's smallest normal: perturbed at the subnormal ulp, normals untouched.

    python -m pytest -q tests/test_twin_mca_subnormal.py

Monte-Carlo arithmetic scales a result's perturbation by its exponent, and below the smallest normal
the format's spacing stops shrinking (2^(emin - p + 1)): a subnormal result must be perturbed at that
spacing. The twin once scaled it by the value's own float64 exponent, a perturbation far under the
format's grid that rounding took straight back off: subnormal results (fp16 softmax tails) had no
spread at all. `old_perturb_mca` below is that code, kept to show normal results replay bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from optwin import twin
from optwin.twin import numerics
from optwin.twin.numerics import FORMATS, Numerics, round_nearest

F64 = torch.float64
EMULATED = ("float16", "bfloat16", "float32")


def old_perturb_mca(x, f, gen, t=None):
    """perturb_mca as it was before subnormals took the format's spacing (the noise scaled by e_x alone)."""
    f = numerics.fmt(f)
    t = f.p if t is None else t
    x = x.to(F64)
    a = x.abs()
    _, e = torch.frexp(a)
    xi = numerics._uniform(gen, tuple(x.shape), x.device) - 0.5
    noise = torch.ldexp(xi, (e - t).to(torch.int64))
    scaled = torch.ldexp(a, -(torch.clamp(e - 1, min=f.emin) - (t - 1)))
    inexact = scaled != torch.floor(scaled)
    return torch.where(torch.isfinite(x) & (x != 0) & inexact, x + noise, x)


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bitwise equality (NaN where NaN, signs of zeros too), naming how many and which elements differ."""
    nan_g, nan_w = torch.isnan(got), torch.isnan(want)
    bad = (nan_g != nan_w) | (~nan_w & ((got != want) | (torch.signbit(got) != torch.signbit(want))))
    if bad.any():
        idx = bad.flatten().nonzero().flatten()[:5].tolist()
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.numel()} differ; first flat indices {idx}: "
                             f"got {got.flatten()[idx].tolist()} want {want.flatten()[idx].tolist()}")


@pytest.mark.parametrize("name", EMULATED)
def test_subnormal_results_spread_at_the_subnormal_ulp(name: str) -> None:
    """k + 0.3 subnormal ulps must round up in about 30 % of the replays (as a normal value 0.3 ulp past
    a grid point does), a zero-crossing must keep the value's sign, and exact subnormals stay put."""
    f = FORMATS[name]
    step = 2.0 ** (f.emin - f.p + 1)  # the format's subnormal spacing
    x = torch.tensor([0.3, 7.3, -40.3, 2.0 ** (f.p - 1) - 1.7, 5.0, -9.0], dtype=F64) * step  # last two exact
    num = Numerics("mca", replays=4000, seed=11)
    out = num.round(num.expand(x), f) / step  # (4000, 6) in subnormal ulps
    up = (out.abs() - (x / step).abs().floor()).mean(0)  # how often each moved away from zero
    for i in range(4):
        assert set(out[:, i].unique().tolist()) == {float((x[i] / step).trunc()), float((x[i] / step).trunc() + x[i].sign())}, i
        assert 0.26 < float(up[i]) < 0.34, (i, float(up[i]))
    assert not torch.signbit(out[:, 0]).any()  # 0.3 ulps that rounds to zero is +0.0, as rounding 0.3 ulps is
    assert torch.equal(out[:, 4:], (x[4:] / step).expand(4000, 2))


@pytest.mark.parametrize("name", EMULATED)
def test_a_lower_virtual_precision_never_flips_a_subnormals_sign(name: str) -> None:
    """At t < p the noise held at the smallest spacing reaches 2^(p-t-1) subnormal ulps, more than a small
    subnormal: x + noise crossed zero and rounded to a value of the other sign (a negative softmax probability
    in 73 of 256 replays at t = 8 in float16). It stops at a zero of x's sign; larger subnormals still spread."""
    f = FORMATS[name]
    step = 2.0 ** (f.emin - f.p + 1)
    x = torch.tensor([1.0, 0.3, -2.0, 300.3], dtype=F64) * step
    num = Numerics("mca", replays=2000, seed=5, mca_precision=f.p - 3)
    out = num.round(num.expand(x), f)
    assert (torch.signbit(out) == torch.signbit(x)).all()
    assert (out[:, 0] == 0).any() and (out[:, 0] > step).any()  # still spread, both ways
    assert out[:, 3].unique().numel() > 2  # 300 ulps at t = p - 3: a coarser grid, several values


@pytest.mark.parametrize("name", EMULATED)
@pytest.mark.parametrize("seed", [0, 3])
def test_normal_results_replay_as_before(name: str, seed: int) -> None:
    """Normal-range results take the same perturbation as before the subnormal fix, bit for bit, per
    replay generator and from a plain generator, at the format's precision and a lower virtual one."""
    f = FORMATS[name]
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(f.emin, f.emax, (3, 257), generator=g)
    x = torch.ldexp(1.0 + torch.rand(3, 257, generator=g, dtype=F64), e)  # every value normal in f
    x = torch.where(torch.rand(3, 257, generator=g) < 0.5, -x, x)
    for t in (None, f.p - 3):
        new = Numerics("mca", replays=3, seed=seed, mca_precision=t)
        old = Numerics("mca", replays=3, seed=seed, mca_precision=t)
        want = round_nearest(old_perturb_mca(x, f, old.draws, f.p if t is None else t), f)
        assert_same(new.round(x, f), want, f"{name} t={t}")
        assert_same(numerics.perturb_mca(x, f, torch.Generator().manual_seed(seed), t),
                     old_perturb_mca(x, f, torch.Generator().manual_seed(seed), t), f"{name} t={t} plain generator")


def test_fp16_softmax_tails_spread_and_normal_outputs_replay_as_before(monkeypatch) -> None:
    """fp16 softmax outputs below 2^-14 now spread across mca replays (they did not at all); every
    output in the normal range replays exactly as under the old perturbation."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(8, 64, generator=g) * 5).to(torch.float16)  # (8, 64): tails from ~1e-9 to normal
    run = lambda: twin.run("softmax", "torch", "float16", {"x": x}, noise="mca", replays=200, seed=2, keep_replays=True)
    res = run()
    with monkeypatch.context() as m:
        m.setattr(numerics, "perturb_mca", old_perturb_mca)
        before = run()
    y = res.exact  # (8, 64) float64 reference
    sub = (y > 2.0**-24) & (y < 2.0**-14)  # subnormal in fp16 and not rounded away to zero
    normal = y >= 2.0**-13  # well clear of the subnormal range, whatever the rounding
    assert int(sub.sum()) > 50 and int(normal.sum()) > 50
    step = 2.0**-24
    spread_new = (res.replays.std(0) / step)[sub]  # (n_sub,) in subnormal ulps
    spread_old = (before.replays.std(0) / step)[sub]
    assert float(spread_old.mean()) < 0.05  # today's bug: rounding undid the perturbation
    assert float(spread_new.mean()) > 0.3, float(spread_new.mean())  # pi/8 ~ 0.39 for a uniformly placed value
    assert float((spread_new > 0).float().mean()) > 0.8
    assert_same(res.replays[:, normal], before.replays[:, normal], "normal-range softmax outputs")
