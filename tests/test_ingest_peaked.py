"""`peaked_frac` (softmax, attention): the sketch feature behind low_entropy agrees with the fault
predicate it stands for, and attention's strided sample stays close to the exact fraction."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from optwin.ingest import sketch
from optwin.twin import references, to_float64
from optwin.twin.faults import low_entropy

sketch_module = importlib.import_module("optwin.ingest.sketch")  # the module, not the function


def _softmax_inputs(g: torch.Generator, scale: float, masked: bool) -> dict[str, torch.Tensor]:
    x = torch.randn(9, 33, generator=g) * scale  # (rows, n)
    if masked:
        x[2] = -math.inf  # a fully masked row is not a row with a finite reference
        x[4, ::3] = -math.inf
    return {"x": x}


@pytest.mark.parametrize("masked", [False, True])
def test_softmax_peaked_frac_decides_low_entropy(masked: bool) -> None:
    g = torch.Generator().manual_seed(3)
    agree, both = 0, set()
    for scale in [0.5, 2, 4, 6, 8, 10, 12, 16, 24, 40]:
        inputs = _softmax_inputs(g, scale, masked)
        _, prob = references("softmax", to_float64(inputs), {})
        fault = bool(low_entropy(prob))
        frac = sketch("softmax", inputs)["peaked_frac"]
        assert 0.0 <= frac <= 1.0
        agree += fault == (frac > 0.5)
        both.add(fault)
    assert agree == 10 and both == {True, False}  # the sweep crosses the boundary


@pytest.mark.parametrize("causal", [False, True])
def test_attention_peaked_frac_decides_low_entropy(causal: bool) -> None:
    g = torch.Generator().manual_seed(5)
    outcomes = set()
    for scale in [0.3, 1, 2, 3, 4, 6]:
        q, k, v = (torch.randn(2, 3, 17, 16, generator=g) * scale for _ in range(3))
        inputs = {"q": q, "k": k, "v": v}
        params = {"causal": causal}
        _, prob = references("attention", to_float64(inputs), params)
        fault = bool(low_entropy(prob))
        frac = sketch("attention", inputs, params)["peaked_frac"]
        assert fault == (frac > 0.5), (scale, frac)
        outcomes.add(fault)
    assert outcomes == {True, False}


def test_attention_sampling_tracks_exact_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 4, 256, 16, generator=g) for _ in range(3))
    q = q * torch.linspace(0.5, 24.0, 256)[:, None]  # rows from flat to peaked: the fraction is mid-range
    exact = sketch("attention", {"q": q, "k": k, "v": v})["peaked_frac"]
    monkeypatch.setattr(sketch_module, "ATTENTION_SCORE_BUDGET", 2 * 4 * 256 * 16)  # 16 rows per head
    sampled = sketch("attention", {"q": q, "k": k, "v": v})["peaked_frac"]
    assert 0.1 < exact < 0.9
    assert abs(sampled - exact) < 0.1


def test_attention_max_score_decides_math_float16_overflow() -> None:
    from optwin import twin

    g = torch.Generator().manual_seed(11)
    seen = set()
    for scale in [20.0, 40.0, 55.0, 70.0, 90.0]:
        q, k, v = (torch.randn(1, 2, 9, 16, generator=g) * scale for _ in range(3))
        inputs = {"q": q.half(), "k": k.half(), "v": v.half()}
        s = sketch("attention", inputs, {"causal": False})
        if abs(s["max_score"] - 65504.0) < 0.02 * 65504.0:
            continue  # the fp16 rounding of the score decides right at the edge
        fault = twin.run("attention", "math", "float16", inputs, {"causal": False}).faults["nonfinite"]
        assert fault == (s["max_score"] > 65504.0), (scale, s["max_score"])
        assert s["max_score"] <= s["score_bound"] * 4.0 + 1e-6  # sqrt(d) = 4: the bound holds
        seen.add(fault)
    assert seen == {True, False}


def test_softmax_min_row_max_decides_naive_float16_underflow() -> None:
    from optwin import twin

    g = torch.Generator().manual_seed(13)
    seen = set()
    for low in [-5.0, -12.0, -16.0, -19.0, -25.0]:
        x = torch.randn(6, 40, generator=g)  # (rows, n), row maxima ~ 2
        x[3] = low + 0.5 * torch.rand(40, generator=g) - 0.5  # one row lies entirely near `low`
        inputs = {"x": x.half()}
        s = sketch("softmax", inputs)
        fault = twin.run("softmax", "naive", "float16", inputs).faults["nonfinite"]
        # every exp of that row underflows float16 (below ln 2^-24 = -16.6) -> 0/0
        assert fault == (s["min_row_max"] < -16.7), (low, s["min_row_max"])
        assert s["max"] < 11.0  # so overflow is not what decides it
        seen.add(fault)
    assert seen == {True, False}
