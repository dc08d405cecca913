"""Profile samples of layernorm keep the captured weight and bias magnitudes and absmax/rms.

    python -m pytest -q tests/test_ingest_fit_layernorm_params.py

Samples used to draw weight = 1 + 0.2 N(0, 1) and bias = 0.1 N(0, 1) whatever was captured
(max|weight| ~1.6 and max|bias| ~0.3 in every sample), so a layer whose weight or bias is large,
where the final affine step overflows or loses precision, was never replayed at its size.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from optwin.ingest import fit_sketches, sample_inputs, sketch
from optwin.ingest.capture import capture
from optwin.ingest.models import default_texts, load_model
from optwin.ingest.profile import sketch_frame

H = 384


def test_layernorm_samples_keep_weight_and_bias_absmax() -> None:
    g = torch.Generator().manual_seed(0)
    with capture() as rec:
        for i in range(80):
            x = torch.randn(16, H, generator=g) * (1 + i % 5)
            w = 1 + 0.2 * torch.randn(H, generator=g) * (1 + i / 10) ** 2  # layers of very different weights
            b = 0.05 * torch.randn(H, generator=g) * (1 + i / 8) ** 2
            F.layer_norm(x, (H,), w, b)
    recs = rec.records()
    cases = sample_inputs("layernorm", "float32", fit_sketches(sketch_frame(recs)), 400, seed=0)
    q = [0.1, 0.5, 0.9]
    for k in ("weight_absmax", "bias_absmax"):
        qc = np.quantile([r["sketch"][k] for r in recs], q)
        qs = np.quantile([sketch("layernorm", c.inputs)[k] for c in cases], q)
        assert np.all(np.abs(qs / qc - 1) <= 0.2), (k, qc, qs)


def test_minilm_layernorm_samples_keep_absmax_over_rms() -> None:
    """MiniLM's layernorm inputs carry outlier channels (absmax/rms ~33 at the median); samples of
    normal rows had ~4.5, so a replay never held the few huge channels next to small ones."""
    lm = load_model("minilm")
    with torch.no_grad(), capture(lm.module) as rec:
        for batch in lm.batches(default_texts(24), 4):
            lm.module(**batch)
    recs = [r for r in rec.records() if r["op"] == "layernorm"]
    cases = sample_inputs("layernorm", "float32", fit_sketches(sketch_frame(recs)), 200, seed=0)
    q = [0.1, 0.5, 0.9]
    rc = np.quantile([r["sketch"]["absmax"] / r["sketch"]["rms"] for r in recs], q)
    sk = [sketch("layernorm", c.inputs) for c in cases]
    rs = np.quantile([s["absmax"] / s["rms"] for s in sk], q)
    assert np.all(np.abs(rs / rc - 1) <= 0.3), (rc, rs)
