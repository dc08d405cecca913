"""geodesic twin: acos loses near-identical points (c rounds to the float32 spacing at 1), haversine
does not; large separations are clean for both.

    python -m pytest -q tests/test_twin_geodesic.py
"""

from __future__ import annotations

import math

import pytest
import torch

from optwin import twin
from optwin.kernels.production import run_variant
from optwin.twin import geodesic
from optwin.twin.numerics import ulps_between


def _pairs(sep_deg: float, span_deg: float, seed: int = 0, n: int = 64) -> dict[str, torch.Tensor]:
    """n point pairs sep_deg apart in random directions, the first point within +-span_deg."""
    g = torch.Generator().manual_seed(seed)
    lat1 = (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * min(span_deg, 80)
    lon1 = (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * min(2 * span_deg, 180)
    th = torch.rand(n, generator=g, dtype=torch.float64) * 2 * math.pi
    return {"lat1": lat1.float(), "lon1": lon1.float(),
            "lat2": (lat1 + sep_deg * th.sin()).float(), "lon2": (lon1 + sep_deg * th.cos()).float()}


def _faults(variant: str, inp: dict[str, torch.Tensor]) -> dict[str, bool]:
    return twin.run("geodesic", variant, "float32", inp).faults


def test_reference_is_the_great_circle_distance() -> None:
    inp = {"lat1": torch.tensor([0.0, 0.0, 90.0]), "lon1": torch.tensor([0.0, 0.0, 0.0]),
           "lat2": torch.tensor([0.0, 0.0, -90.0]), "lon2": torch.tensor([90.0, 180.0, 0.0])}
    r = geodesic.reference(twin.to_float64(inp), {})
    q = math.pi * geodesic.R_KM
    assert torch.allclose(r, torch.tensor([q / 2, q, q], dtype=torch.float64), rtol=1e-14)


@pytest.mark.parametrize("sep,span", [(1e-5, 0.001), (1e-4, 0.01), (0.01, 80.0), (0.05, 80.0)])
def test_acos_loses_near_identical_points_haversine_does_not(sep: float, span: float) -> None:
    inp = _pairs(sep, span, seed=int(1 / sep))
    f = _faults("acos", inp)
    assert f["precision_loss"] or f["nonfinite"]
    assert not any(_faults("haversine", inp).values())


@pytest.mark.parametrize("sep", [5.0, 30.0, 120.0])
def test_large_separations_are_clean(sep: float) -> None:
    inp = _pairs(sep, 80.0, seed=int(sep))
    assert not any(_faults("acos", inp).values())
    assert not any(_faults("haversine", inp).values())


def test_identical_far_from_the_origin_rounds_c_past_one() -> None:
    # cos^2 + sin^2 rounded in float32 exceeds 1 for some latitudes: acos(c > 1) is NaN.
    lat = torch.linspace(10, 80, 200)
    inp = {"lat1": lat, "lon1": lat, "lat2": lat, "lon2": lat}
    assert _faults("acos", inp)["nonfinite"]
    y = run_variant("geodesic", "acos", "float32", inp)
    assert not torch.isfinite(y).all()  # production agrees (CPU float32)
    assert not any(_faults("haversine", inp).values())


@pytest.mark.parametrize("variant", ["acos", "haversine"])
@pytest.mark.parametrize("sep", [0.05, 20.0])
def test_twin_tracks_cpu_production(variant: str, sep: float) -> None:
    inp = _pairs(sep, 80.0, seed=7, n=256)
    res = twin.run("geodesic", variant, "float32", inp)
    y = run_variant("geodesic", variant, "float32", inp).double()
    u = ulps_between(res.emulated, y, "float32")
    # Most elements agree bit for bit; acos amplifies a 1-ulp sinf/cosf difference in c by
    # 1/sin(theta), so compare the size of the error rather than the bits.
    assert u.median().item() == 0
    prod_rel = ((y - res.exact).norm() / res.exact.norm()).item()
    assert 0.5 < res.rel_error / prod_rel < 2, (res.rel_error, prod_rel)
    if variant == "haversine":
        # sin, cos, sqrt and asin each within an ulp of correctly rounded in torch's vector libm (which path, AVX2
        # or AVX-512, depends on the CPU: an AVX-512 host read 3 ulps at one of 256 elements); the twin rounds
        # each correctly, so a few ulps apart at the most
        assert u.max().item() <= 4


def test_acos_rounds_the_sine_product_as_eager_torch_does() -> None:
    """Production runs sin(p1) * sin(p2) as its own kernel: the product is rounded to float32 before the add. The
    twin once kept it exact (an FMA the GPU never runs) and put c past 1 for this pair: NaN where torch gives 0."""
    t = lambda v: torch.tensor([v], dtype=torch.float32)  # noqa: E731
    inp = {"lat1": t(-37.062137603759766), "lon1": t(76.95834350585938), "lat2": t(-37.06154251098633),
           "lon2": t(76.95684814453125)}
    res = twin.run("geodesic", "acos", "float32", inp)
    assert torch.isfinite(run_variant("geodesic", "acos", "float32", inp)).all()
    assert not res.faults["nonfinite"] and torch.isfinite(res.emulated).all()
    # over many near-identical pairs the twin matches CPU eager bit for bit where the old one matched 88 %
    inp = _pairs(1e-3, 80.0, seed=3, n=4000)
    y = run_variant("geodesic", "acos", "float32", inp).double()
    em = twin.run("geodesic", "acos", "float32", inp).emulated
    same = ((em == y) | (em.isnan() & y.isnan())).double().mean().item()
    assert same > 0.92, same


def test_mca_replays_spread_near_identical_acos() -> None:
    res = twin.run("geodesic", "acos", "float32", _pairs(0.2, 80.0, seed=9), noise="mca", replays=16, seed=1)
    assert res.replay_rel_error.std().item() > 0
    assert res.probability["precision_loss"] > 0.5


def test_precision_loss_is_normwise_so_one_far_pair_hides_the_near_ones() -> None:
    # Why the sketch carries rms_sep_deg: the same near-identical pairs that fault acos alone are
    # under tolerance once a few pairs 90 degrees apart set ||r||. A NaN (c rounded past 1, closer
    # pairs) stays whatever the rest: nonfinite is judged on min_sep_deg alone.
    far = _pairs(90.0, 60.0, seed=4, n=4)
    near = _pairs(1e-2, 60.0, seed=3, n=64)
    both = {k: torch.cat([near[k], far[k]]) for k in near}
    assert _faults("acos", near)["precision_loss"]
    assert not any(_faults("acos", both).values())
    nearer = _pairs(1e-3, 60.0, seed=3, n=64)
    assert _faults("acos", {k: torch.cat([nearer[k], far[k]]) for k in nearer})["nonfinite"]
