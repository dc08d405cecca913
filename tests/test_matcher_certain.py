"""Matcher: faults a sketch makes certain whatever the cells say (CERTAIN_FAULTS), checked against the twins.

    python -m pytest -q tests/test_matcher_certain.py
"""

from __future__ import annotations

import math

import pytest
import torch

from optwin import twin
from optwin.catalog import CATALOG
from optwin.fingerprints.matcher import CERTAIN_FAULTS, KNOWN_RULES, Matcher, MatcherConfig
from optwin.ingest.sketch import SKETCH_FEATURES

SOFTMAX = [("softmax", v, dt) for v in CATALOG["softmax"].variant_names for dt in CATALOG["softmax"].dtypes]


def _masked(dtype: str, rows: int, masked: int, n: int = 64, seed: int = 0) -> torch.Tensor:
    """`rows` softmax rows of random scores, the first `masked` of them all -inf (a padded sequence)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g)  # (rows, n)
    x[:masked] = -math.inf
    return x.to(getattr(torch, dtype))


def test_table_names_real_variants_features_and_fault_types():
    for (op, variant), entries in CERTAIN_FAULTS.items():
        spec = CATALOG[op]
        assert variant in spec.variant_names
        for feature, fault, rule, why in entries:
            assert feature in SKETCH_FEATURES[op] and fault in spec.fault_types and rule in KNOWN_RULES and why


@pytest.mark.parametrize("op,variant,dtype", SOFTMAX)
def test_masked_row_rule_is_what_the_twin_computes(op, variant, dtype):
    # The table says a fully masked row is a certain NaN exactly for the variants whose twin gives one,
    # for rows in registers and rows past TRITON_WHOLE_ROW_MAX (optwin.kernels.softmax_long's pieces) alike.
    certain = any(f == "masked_rows" and ft == "nonfinite" for f, ft, _, _ in CERTAIN_FAULTS.get((op, variant), ()))
    for n in (64, 70000):
        r = twin.run(op, variant, dtype, {"x": _masked(dtype, 3, 1, n)})
        assert bool(r.emulated[0].isnan().all()) == r.faults["nonfinite"] == certain, (variant, dtype, n)
        assert bool(r.emulated[1:].isfinite().all())  # the unmasked rows stay finite: the NaN is the mask's


def test_no_attention_row_is_ever_fully_masked():
    # attention has no mask input and its causal mask is top-left aligned (every query keeps key 0), so its sketch
    # has no masked-row feature and the table no masked-row rule for it: checked on every variant and dtype with
    # more queries than keys, where a bottom-right mask would leave rows without a key.
    assert "masked_rows" not in SKETCH_FEATURES["attention"]
    g = torch.Generator().manual_seed(1)
    for variant in CATALOG["attention"].variant_names:
        for dt in CATALOG["attention"].dtypes:
            q, k, v = (torch.randn(1, 2, s, 16, generator=g).to(getattr(torch, dt)) for s in (9, 4, 4))
            r = twin.run("attention", variant, dt, {"q": q, "k": k, "v": v}, params={"causal": True})
            assert not r.faults["nonfinite"] and bool(r.emulated.isfinite().all()), (variant, dt)


@pytest.mark.parametrize("config", [MatcherConfig(), MatcherConfig.preset("quiet"), MatcherConfig(threshold=0.75),
                                    MatcherConfig(threshold=1.0, beyond_prior=0.0)], ids=["default", "quiet", "t0.75", "t1"])
def test_fully_masked_rows_are_certain_nonfinite(db, config):
    # The builds hold few masked cases, so a sketch with masked rows fell in a cell answered by neighbours
    # ("near": 0.69 at one row of eight on a real build) or by the beyond rule (0.43 with every row masked; 0.5
    # under "quiet"; 0 on a triple never built), and at threshold 0.75 a certain NaN did not warn.
    m = Matcher.open(db, config=config)
    for op, variant, dtype in SOFTMAX:  # naive float16 is built in the fixture, the others are not
        for masked in (1, 8):
            r = m.assess(op, variant, dtype, inputs={"x": _masked(dtype, 8, masked)})
            assert r.sketch["masked_rows"] == masked and r.sketch["nonfinite"] == 0.0
            assert r.probability["nonfinite"] == 1.0, (variant, dtype, masked, r.rule)
            assert r.warn and r.known and r.rule == "masked_row", (variant, dtype, masked)
    # the other fault types still come from the cell, and a stream warns on the call
    x = _masked("float16", 8, 1)
    r = m.assess("softmax", "naive", "float16", inputs={"x": x})
    cell, _ = m.index[("softmax", "naive", "float16")].lookup(r.region, m.config)
    assert r.probability["low_entropy"] == cell[2] and r.probability["precision_loss"] == cell[1]
    s = m.stream("l0.attn.softmax", "softmax", "naive", "float16")
    obs = s.observe(inputs={"x": x}, t=0.0)
    assert obs.warn and obs.known and obs.probability["nonfinite"] == 1.0
