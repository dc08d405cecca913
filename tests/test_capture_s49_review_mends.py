"""Three mends of the capture's patched-eager and padding records, from the final review of session 49.

    python -m pytest -q tests/test_capture_s49_review_mends.py

1. A patched eager attention call (optwin.kernels.patch) is recorded as softmax "triton", never attention: a capture
   of ops=("attention",) recorded nothing and said nothing. It now counts PATCHED_EAGER_SKIP once per call.
2. The wrapper queues a patched call for eager_scores; a call that raised before its softmax left the entry (its
   recorder, samples and all, and its query) in the thread's list past the capture's end. The wrapper now drops it.
3. Cross-attention over a padded encoder (BART's decoder, seq_q != seq_k) was recorded over every key, pad keys
   included, which the model's queries never saw. Each run of batch rows with the same live span is now recorded
   over that span's keys with every decoder query row kept.
Tiny random-weight models; the patched Llama's kernels run under TRITON_INTERPRET=1.
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
from optwin.twin.attention import reference  # noqa: E402

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


def _bart(impl: str):  # noqa: ANN202
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    cfg = BartConfig(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
                     attn_implementation=impl)
    return BartForConditionalGeneration(cfg).eval()


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("tgt", [4, 9])  # fewer and more decoder tokens than the encoder's 7
def test_cross_attention_over_a_padded_encoder_records_each_row_over_its_live_keys(impl: str, tgt: int) -> None:
    model = _bart(impl)
    src = torch.randint(4, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    am = torch.tensor([[1] * 4 + [0] * 3, [1] * 7])  # row 0 right-padded: live keys [0, 4)
    dec = torch.randint(4, 64, (2, tgt), generator=torch.Generator().manual_seed(2))
    spans = [(0, 4), (0, 7)]
    heads, d = 2, 16
    outs: list[torch.Tensor] = []  # each decoder layer's cross-attention output, (b, h, tgt, d)
    hooks = [layer.encoder_attn.out_proj.register_forward_pre_hook(
        lambda m, a: outs.append(a[0].reshape(2, tgt, heads, d).transpose(1, 2).clone()))
        for layer in model.model.decoder.layers]
    try:
        with torch.no_grad(), capture(model, sample_rate=1.0, ops=("attention",)) as rec:
            model(input_ids=src, attention_mask=am, decoder_input_ids=dec)
    finally:
        for h in hooks:
            h.remove()
    cross = [s for s in rec.all_samples() if "encoder_attn" in s.stream]
    # before the fix: one record per layer over all 7 keys, batch row 0's queries seeing its 3 pad keys
    assert len(cross) == len(outs) * len(spans) == 4 and not rec.skipped
    for i, s in enumerate(cross):
        b, (lo, hi) = i % 2, spans[i % 2]
        assert s.params == {"causal": False}
        assert s.inputs["q"].shape == (1, heads, tgt, d)  # every decoder query row kept
        assert s.inputs["k"].shape == s.inputs["v"].shape == (1, heads, hi - lo, d)
        replay = reference({n: t.double() for n, t in s.inputs.items()}, {"causal": False})
        torch.testing.assert_close(replay, outs[i // 2][b:b + 1].double(), rtol=1e-5, atol=1e-5)
