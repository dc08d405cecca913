"""An encoder's padded batch (MiniLM, BERT) is recorded per batch row over its live keys and replays the model.

    python -m pytest -q tests/test_capture_s49_encoder_padding.py

BERT hands its attention of a padded batch (tokenizer(padding=True)) one bidirectional mask, (b, 1, s, s), with
each batch row's pad keys masked (a prepared (b, 1, 1, s) mask likewise). The catalog's attention takes no mask,
and the capture recorded such a call as one non-causal call over every key: the twin's replay of a padded row let
its queries see the pad keys the model's never saw. As for a decoder's padded batch (34a5c8c,
tests/test_capture_s49_padding.py), each run of batch rows with the same live span is now recorded non-causal
over that span, its query rows the live tokens' (the pad tokens' rows are ignored by the model's pooling), and a
row with holes in its live keys skips the call (PADDING_HOLES_SKIP). Without padding BERT passes no mask: one
record per layer, as before.
"""

from __future__ import annotations

import functools

import pytest
import torch
from _attention_spy import AttentionSpy

from optwin.ingest.capture import PADDING_HOLES_SKIP, capture
from optwin.ingest.models import load_minilm
from optwin.twin.attention import reference

# rows 1 and 2 are one text: one live span, one record for both
TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank.", "A short one.", "A short one."]


@functools.cache
def _minilm(impl: str):  # noqa: ANN202 - loaded once per attention implementation for the whole file
    return load_minilm(impl)


def _attention(m, impl: str) -> AttentionSpy:  # noqa: ANN001
    """MiniLM's attention calls, their masks and its own attention output (BertSelfOutput.dense's input) for each."""
    import transformers.models.bert.modeling_bert as mb

    return AttentionSpy(m, impl, mb, [layer.attention.output.dense for layer in m.encoder.layer], keep_masks=True)


def _run(impl: str, texts: list[str], side: str = "right", mask4d: str | None = None):  # noqa: ANN202
    """Capture MiniLM on `texts` (tokenizer(padding=True), padded on `side`); with `mask4d` its 2-D mask handed in
    prepared as (b, 1, 1, s) ("shared") or (b, 1, s, s) ("full"), bool for sdpa and additive for eager (BERT passes
    a 4-D mask on as it is)."""
    lm = _minilm(impl)
    m, tok = lm.module, lm.tokenizer
    tok.padding_side = side
    try:
        enc = dict(tok(texts, padding=True, return_tensors="pt"))
    finally:
        tok.padding_side = "right"
    am = enc["attention_mask"]
    if mask4d:
        live = am[:, None, None, :].bool()
        live = live if mask4d == "shared" else live.expand(-1, 1, am.shape[1], -1).clone()
        enc["attention_mask"] = live if impl == "sdpa" else (~live).float() * torch.finfo(torch.float32).min
    with torch.no_grad(), _attention(m, impl) as seen, capture(m, sample_rate=1.0, capacity=100) as rec:
        m(**enc)
    return rec, seen, am


def _spans(am: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """(b, c, s, e): each run of batch rows b..c-1 whose live tokens are the one span [s, e)."""
    spans = []
    for row in am.tolist():
        live = [i for i, x in enumerate(row) if x]
        spans.append((live[0], live[-1] + 1))
    runs, b = [], 0
    while b < len(spans):
        c = b + 1
        while c < len(spans) and spans[c] == spans[b]:
            c += 1
        runs.append((b, c, *spans[b]))
        b = c
    return runs


def _replay(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return reference({n: t.double() for n, t in inputs.items()}, {"causal": False})


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("how", ["right", "left", "right-4d"])
def test_a_padded_encoder_batch_records_each_row_run_over_its_live_keys(impl: str, how: str) -> None:
    """Per layer, one non-causal record per run of batch rows with one live span (the long text's row, then the two
    short texts' rows together): its q, k, v the model's [b:c, :, s:e], and its float64 replay the model's own
    attention output for those rows' live tokens. The old record (the whole batch, non-causal over every key)
    replayed the short rows with their queries seeing the pad keys. Every layer is handed the one mask tensor,
    read once (rec._mask_seen keeps its verdict)."""
    rec, seen, am = _run(impl, TEXTS, side=how.split("-")[0], mask4d="shared" if how.endswith("4d") else None)
    runs = _spans(am)
    assert len(runs) == 2 and runs[1][:2] == (1, 3) and (runs[1][2] > 0) == (how == "left")
    att = [r for r in rec.records() if r["op"] == "attention"]
    kept = [s for s in rec.all_samples() if s.op == "attention"]
    layers = len(seen.qkv)
    assert layers == 6 and len(att) == len(kept) == layers * len(runs) and not rec.skipped
    assert all(mk is seen.masks[0] for mk in seen.masks) and rec._mask_seen[0] is seen.masks[0]
    assert seen.masks[0].shape == (3, 1, 1 if how.endswith("4d") else am.shape[1], am.shape[1])
    for call, ((q, k, v), out) in enumerate(zip(seen.qkv, seen.out)):
        for i, (b, c, s, e) in enumerate(runs):
            r, smp = att[call * len(runs) + i], kept[call * len(runs) + i]
            rows = (slice(b, c), slice(None), slice(s, e))
            for name, t in (("q", q), ("k", k), ("v", v)):
                assert torch.equal(smp.inputs[name], t[rows]), (call, b, name)
            assert r["params"] == smp.params == {"causal": False}
            assert (r["sketch"]["batch"], r["sketch"]["seq_q"], r["sketch"]["seq_k"]) == (c - b, e - s, e - s)
            torch.testing.assert_close(_replay(smp.inputs), out[rows].double(), rtol=1e-5, atol=1e-5)
        b, c, s, e = runs[1]  # the old record: right for the unpadded row 0, wrong for the padded rows' live tokens
        old = _replay({"q": q, "k": k, "v": v})
        torch.testing.assert_close(old[0], out[0].double(), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(old[b:c, :, s:e], out[b:c, :, s:e].double(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("mask4d", [None, "shared", "full"])
def test_an_unpadded_encoder_batch_stays_one_record_per_layer(impl: str, mask4d: str | None) -> None:
    """Texts of one length: BERT passes no mask (or, handed one prepared, a mask of every key), and each layer's
    call is one non-causal record of the whole batch, as before."""
    rec, seen, am = _run(impl, TEXTS[1:], mask4d=mask4d)
    assert bool(am.all()) and all((mk is not None) == bool(mask4d) for mk in seen.masks)
    att = [r for r in rec.records() if r["op"] == "attention"]
    assert len(att) == len(seen.qkv) == 6 and not rec.skipped
    for r, (q, _, _) in zip(att, seen.qkv):
        assert r["params"] == {"causal": False}
        assert (r["sketch"]["batch"], r["sketch"]["seq_q"], r["sketch"]["seq_k"]) == (2, q.shape[2], q.shape[2])


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_an_encoder_row_with_holes_in_its_live_keys_is_skipped(impl: str) -> None:
    """A pad token inside a batch row (attention mask 1 1 0 1 1 ...): its live keys are not one span, so no catalog
    call replays it: each layer's call skipped and counted."""
    lm = _minilm(impl)
    enc = dict(lm.tokenizer(TEXTS[1:], padding=True, return_tensors="pt"))
    enc["attention_mask"][1, 2] = 0
    with torch.no_grad(), capture(lm.module, sample_rate=1.0, capacity=100) as rec:
        lm.module(**enc)
    assert [r for r in rec.records() if r["op"] == "attention"] == [] and rec.skipped == {PADDING_HOLES_SKIP: 6}
