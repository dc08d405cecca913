"""Profile samples of attention keep causal long-context prefills causal, and self-attention's
seq_q == seq_k.

    python -m pytest -q tests/test_ingest_fit_attention_seq.py

Samples used to cap seq_q at 64 and drop the causal flag whenever seq_k was larger (a llama prefill
of 96..510 tokens came back non-causal, peaked_frac 0), and drew seq_q and seq_k apart for BERT
self-attention (ties ranked at random per feature in the copula).
"""

from __future__ import annotations

import numpy as np
import torch

from optwin.ingest import fit_sketches, sample_inputs, sketch
from optwin.ingest.capture import capture
from optwin.ingest.models import default_texts, load_llama_tiny, load_model
from optwin.ingest.profile import sketch_frame

NAMES = ("seq_q", "seq_k", "causal", "peaked_frac", "score_bound")


def _attention(recs: list[dict], cases: list) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    cap = np.array([[r["sketch"][k] for k in NAMES] for r in recs if r["op"] == "attention"])
    smp = np.array([[sketch("attention", c.inputs, c.params)[k] for k in NAMES] for c in cases])
    return cap, smp


def test_long_causal_prefill_samples_stay_causal() -> None:
    m = load_llama_tiny("sdpa").module
    g = torch.Generator().manual_seed(0)
    with torch.no_grad(), capture(m) as rec:
        for n in (80, 96, 128, 160):
            m(input_ids=torch.randint(1, 1000, (1, n), generator=g))
    recs = rec.records()
    cases = sample_inputs("attention", "float32", fit_sketches(sketch_frame(recs)), 12, seed=0)
    cap, smp = _attention(recs, cases)
    assert (cap[:, 2] == 1).all() and (cap[:, 1] > 64).all()
    assert (smp[:, 2] == 1).all() and all(c.params["causal"] for c in cases)
    assert (smp[:, 0] == smp[:, 1]).all() and set(smp[:, 1]) <= set(cap[:, 1])
    # The first query of a causal row sees one key: peaked, so peaked_frac ~ 1/seq, never 0.
    lo, hi = cap[:, 3].min(), cap[:, 3].max()
    assert (smp[:, 3] >= lo * 0.8).all() and (smp[:, 3] <= hi * 1.25).all(), (cap[:, 3], smp[:, 3])


def test_self_attention_samples_keep_seq_q_equal_seq_k() -> None:
    lm = load_model("minilm")
    with torch.no_grad(), capture(lm.module) as rec:
        for batch in lm.batches(default_texts(24), 4):
            lm.module(**batch)
    recs = rec.records()
    cases = sample_inputs("attention", "float32", fit_sketches(sketch_frame(recs)), 60, seed=1)
    cap, smp = _attention(recs, cases)
    assert (cap[:, 0] == cap[:, 1]).all() and len(np.unique(cap[:, 1])) > 1
    assert (smp[:, 0] == smp[:, 1]).all(), smp[smp[:, 0] != smp[:, 1], :2]
    assert set(smp[:, 1]) <= set(cap[:, 1])
