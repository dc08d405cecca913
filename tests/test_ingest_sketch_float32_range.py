"""The CPU fast path steps aside when a row's float32 sum of squares could overflow, and the matcher
never raises a bare OverflowError on a huge or infinite sketch value.

    python -m pytest -q tests/test_ingest_sketch_float32_range.py
"""

from __future__ import annotations

import math

import pytest
import torch

from _matcher_fixture import _rmsnorm_case, cached_db
from optwin.errors import SketchError
from optwin.fingerprints.matcher import Matcher
from optwin.ingest import sketch_tensor
from optwin.ingest.sketch import FEATURE_CAP


def _cases(big: float, g: torch.Generator) -> dict[str, dict[str, torch.Tensor]]:
    """Finite float32 inputs whose elements are each < 1e18 (the old per-element fast range) but whose
    rows of 4096 squares sum past float32's 3.4e38."""
    r = lambda *s: 1.0 + torch.rand(*s, generator=g)  # noqa: E731  in [1, 2): no zeros
    return {
        "rmsnorm": {"x": r(2, 4096) * big, "weight": r(4096)},
        "matmul": {"a": r(3, 4096) * big, "b": r(4096, 5)},
        "matmul_b": {"a": r(3, 4096), "b": r(4096, 5) * big},  # column norms of b over k = 4096
        "attention": {"q": r(1, 2, 3, 4096) * big, "k": r(1, 2, 4, 4096), "v": r(1, 2, 4, 4096)},
        "layernorm": {"x": torch.randn(2, 4096, generator=g) * big, "weight": r(4096), "bias": r(4096)},
    }


@pytest.mark.parametrize("big", [5e17, 1.5e17, 3e16])
def test_fast_path_matches_exact_when_row_squares_pass_float32(big: float) -> None:
    for name, inp in _cases(big, torch.Generator().manual_seed(3)).items():
        op = name.split("_")[0]
        names, fast = sketch_tensor(op, inp)
        _, exact = sketch_tensor(op, inp, exact=True)
        assert torch.isfinite(fast).all(), (name, dict(zip(names, fast.tolist())))
        assert torch.allclose(fast, exact, rtol=2e-6, atol=0), (name, dict(zip(names, (fast / exact).tolist())))


@pytest.fixture(scope="module")
def matcher(tmp_path_factory) -> Matcher:
    return Matcher.open(cached_db(str(tmp_path_factory.mktemp("fp") / "fp.duckdb")))


def test_assess_of_huge_float32_input_does_not_overflow(matcher: Matcher) -> None:
    x = torch.full((2, 4096), 5e17)
    r = matcher.assess("rmsnorm", "fp32-acc", "float32", inputs={"x": x, "weight": torch.ones(4096)})
    assert r.sketch["max_row_rms"] == pytest.approx(5e17, rel=1e-6)


def test_assess_clamps_an_infinite_sketch_value_beyond_every_region(matcher: Matcher, monkeypatch) -> None:
    # Fault injection: no catalog-dtype tensor yields inf once the fast path guards its range, so a
    # sketch producer that overflows anyway (a future bound, a patched kernel) is simulated here.
    import importlib

    sk_mod = importlib.import_module("optwin.ingest.sketch")  # the module: optwin.ingest.sketch is also a function

    real = sk_mod.sketch
    inp = _rmsnorm_case(torch.Generator().manual_seed(1), 20.0, 64)
    safe = matcher.assess("rmsnorm", "native-dtype", "float16", inputs=inp)
    assert not safe.warn
    monkeypatch.setattr(sk_mod, "sketch", lambda *a, **k: {**real(*a, **k), "absmax": math.inf, "max_row_rms": math.inf})
    r = matcher.assess("rmsnorm", "native-dtype", "float16", inputs=inp)
    assert r.sketch["absmax"] == r.sketch["max_row_rms"] == FEATURE_CAP
    assert r.rule == "beyond" and not r.known and r.warn  # maximal risk, as validate_sketch's clamp gives
    s = matcher.stream("layers.0.norm", "rmsnorm", "native-dtype", "float16")
    assert s.observe(inputs=inp, t=0.0).warn  # Stream.observe sketches through the same path
    monkeypatch.setattr(sk_mod, "sketch", lambda *a, **k: {**real(*a, **k), "rms": math.nan})
    with pytest.raises(SketchError, match="rmsnorm: sketch feature rms is NaN"):
        matcher.assess("rmsnorm", "native-dtype", "float16", inputs=inp)
