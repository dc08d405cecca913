"""Profile samples of long non-causal self-attention are capped like causal ones.

    python -m pytest -q tests/test_ingest_fit_attention_long_self.py

A non-causal call with seq_q == seq_k > CAP_SELF_SEQ used to be sampled at full length (4096 x 4096
float64 scores with batch and heads cut to 1: 8x MAX_SCORES; a 32k-token encoder ~8 GB a case).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from optwin.ingest import fit_sketches, sample_inputs
from optwin.ingest.capture import capture
from optwin.ingest.fit import CAP_SELF_SEQ, MAX_SCORES
from optwin.ingest.profile import sketch_frame

SEQ = 2600  # just past CAP_SELF_SEQ: a cheap capture that still needs the cap


def test_long_noncausal_self_attention_samples_within_bound() -> None:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad(), capture() as rec:
        for _ in range(3):
            q, k, v = (torch.randn(1, 2, SEQ, 16, generator=g) for _ in range(3))
            F.scaled_dot_product_attention(q, k, v)
    recs = rec.records()
    assert all(r["sketch"]["seq_q"] == r["sketch"]["seq_k"] == SEQ for r in recs if r["op"] == "attention")
    cases = sample_inputs("attention", "float32", fit_sketches(sketch_frame(recs)), 4, seed=0)
    for c in cases:
        b, h, sq, _ = c.inputs["q"].shape
        sk = c.inputs["k"].shape[-2]
        assert sq == sk == CAP_SELF_SEQ  # still self-attention, capped
        assert b * h * sq * sk <= max(MAX_SCORES, CAP_SELF_SEQ**2)
