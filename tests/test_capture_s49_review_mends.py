"""Mends of the capture's patched-eager and padding records, from the final review of session 49.

    python -m pytest -q tests/test_capture_s49_review_mends.py

1. A patched eager attention call (optwin.kernels.patch) is recorded as softmax "triton", never attention: a capture
   of ops=("attention",) recorded nothing and said nothing. It now counts PATCHED_EAGER_SKIP once per call.
A tiny random-weight Llama; the patched kernels run under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402

import optwin.kernels  # noqa: E402
from optwin.ingest.capture import PATCHED_EAGER_SKIP, capture  # noqa: E402
from optwin.ingest.models import load_llama_tiny  # noqa: E402

IDS = torch.randint(0, 1000, (1, 6), generator=torch.Generator().manual_seed(5))  # (batch, seq)
LAYERS = 2  # load_llama_tiny's


def test_an_attention_only_capture_of_a_patched_eager_model_counts_why_it_recorded_nothing() -> None:
    model = load_llama_tiny("eager").module
    with torch.no_grad(), optwin.kernels.patch(model) as handle, \
            capture(model, sample_rate=1.0, ops=("attention",)) as rec:
        model(IDS)
        model(IDS)
    assert handle.calls["softmax"] == 2 * LAYERS  # the patched kernel ran every call
    # before the fix: no record and skipped == {}
    assert rec.records() == [] and rec.skipped == {PATCHED_EAGER_SKIP: 2 * LAYERS}
