"""Mends of the capture's patched-eager and padding records, from the final review of session 49.

    python -m pytest -q tests/test_capture_s49_review_mends.py

1. A patched eager attention call (optwin.kernels.patch) is recorded as softmax "triton", never attention: a capture
   of ops=("attention",) recorded nothing and said nothing. It now counts PATCHED_EAGER_SKIP once per call.
2. The wrapper queues a patched call for eager_scores; a call that raised before its softmax left the entry (its
   recorder, samples and all, and its query) in the thread's list past the capture's end. The wrapper now drops it.
A tiny random-weight Llama; the patched kernels run under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import weakref

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

import optwin.kernels  # noqa: E402
from optwin.ingest.capture import PATCHED_EAGER_SKIP, capture  # noqa: E402
from optwin.ingest.models import load_llama_tiny  # noqa: E402

C = importlib.import_module("optwin.ingest.capture")  # the module, for its per-thread queue
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


def test_a_patched_eager_call_that_raises_leaves_no_queued_entry() -> None:
    model = load_llama_tiny("eager").module
    attn = model.model.layers[0].self_attn
    mod = sys.modules[type(attn).__module__]
    # k's head dim does not match q's: QK^T raises inside the patched call, after the wrapper queued it
    q, k, v = torch.randn(1, 4, 6, 16), torch.randn(1, 4, 5, 17), torch.randn(1, 4, 5, 16)
    orig = type(attn).forward
    type(attn).forward = lambda self, *a, **kw: mod.eager_attention_forward(self, q, k, v, None, 0.25)
    try:
        with torch.no_grad(), optwin.kernels.patch(model), capture(model, sample_rate=1.0) as rec:
            with pytest.raises(RuntimeError):
                model(IDS)
    finally:
        type(attn).forward = orig
    gone = weakref.ref(rec)
    del rec
    gc.collect()
    # before the fix: one (recorder, q, stream) entry stayed, holding the recorder alive
    assert C._EAGER.waiting == [] and gone() is None
