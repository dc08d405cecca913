"""Profile samples of softmax with a finite mask value keep the captured calls' region features.

    python -m pytest -q tests/test_ingest_fit_softmax_masks.py

Hand-written attention fills key padding with finfo(float16).min or -1e9 instead of -inf (half the
calls here also mask whole padded query rows). The mask widens every row's range to ~65k or 1e9;
samples used to spread each row's scores over that range, so every sample was peaked and had every
row max far below -17.3: fault regions (low_entropy, naive nonfinite) no captured call reached.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import ks_2samp

from optwin import twin
from optwin.catalog import CATALOG
from optwin.ingest import fit_sketches, sample_inputs, sketch
from optwin.ingest.capture import capture
from optwin.ingest.profile import sketch_frame

N_CALLS = 60
N_SAMPLES = 200  # feature quantiles; the twins replay the first N_CALLS of them


def _masked_softmax_calls(fill: float, dtype: torch.dtype) -> list[torch.Tensor]:
    """Scores of growing scale, key padding at `fill`, every other call with padded query rows."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(N_CALLS):
        s = torch.randn(32, 48, generator=g) * (1 + i / 8)
        keep = 20 + i % 12  # real tokens
        pad = (torch.arange(48) >= keep).expand(32, 48).clone()
        if i % 2:
            pad[keep:, :] = True  # padded queries: rows at the mask value throughout
        out.append(s.masked_fill(pad, fill).to(dtype))
    return out


def _faults(x: torch.Tensor, variant: str, dtype: str) -> dict[str, bool]:
    return twin.run("softmax", variant, dtype, inputs={"x": x}, params={}, noise="none", replays=0, seed=0).faults


@pytest.mark.parametrize("fill,dtype", [(float(torch.finfo(torch.float16).min), "float16"), (-1e9, "float32")])
def test_finite_mask_samples_stay_in_captured_regions(fill: float, dtype: str) -> None:
    calls = _masked_softmax_calls(fill, getattr(torch, dtype))
    with capture() as rec:
        for x in calls:
            torch.softmax(x, -1)
    recs = rec.records()
    assert len(recs) == N_CALLS
    cases = sample_inputs("softmax", dtype, fit_sketches(sketch_frame(recs)), N_SAMPLES, seed=3)
    cap = {f: np.array([r["sketch"][f] for r in recs]) for f in CATALOG["softmax"].region_features}
    smp = {f: np.array([sketch("softmax", c.inputs)[f] for c in cases]) for f in cap}
    for f in cap:
        assert ks_2samp(cap[f], smp[f]).statistic <= 0.25, (f, np.quantile(cap[f], [0.05, 0.5, 0.95]),
                                                           np.quantile(smp[f], [0.05, 0.5, 0.95]))
        assert cap[f].min() - 1e-6 * abs(cap[f].min()) <= smp[f].min() and smp[f].max() <= cap[f].max() * 1.5 + 1e-9, f
    assert abs(np.median(smp["peaked_frac"]) - np.median(cap["peaked_frac"])) <= 0.1
    # Rows whose every score is below ln(smallest float16 subnormal): the naive variant's 0/0.
    assert abs((smp["min_row_max"] < -17.3).mean() - (cap["min_row_max"] < -17.3).mean()) <= 0.15
    if dtype == "float16":  # twins' fault rates: captured vs sampled calls
        for variant, fault in (("torch", "low_entropy"), ("naive", "nonfinite")):
            rc = np.mean([_faults(x, variant, dtype)[fault] for x in calls])
            rs = np.mean([_faults(c.inputs["x"], variant, dtype)[fault] for c in cases[:N_CALLS]])
            assert abs(rc - rs) <= 0.15, (variant, fault, rc, rs)
