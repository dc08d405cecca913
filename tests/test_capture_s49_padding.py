"""A padded batch's attention is recorded per batch row over its live keys, and replays what the model computed.

    python -m pytest -q tests/test_capture_s49_padding.py

HF hands attention of a padded batch one mask: causal (a decode step: every key) with the keys no query row of
a batch row sees (its pad tokens) masked. The catalog's attention takes no mask, and the capture recorded such a
call as one causal call over every key: the twin's replay of a left-padded row let its queries see the pad keys
the model's never saw (a decode step's one query too). Each batch row whose live keys are one span (left padding:
a suffix, right padding: a prefix) is now recorded as that row over that span, and a row with holes in its live
keys skips the call (PADDING_HOLES_SKIP).
"""

from __future__ import annotations

import pytest
import torch
from _attention_spy import AttentionSpy

from optwin.ingest.capture import PADDING_HOLES_SKIP, capture
from optwin.ingest.models import load_llama_tiny
from optwin.twin.attention import reference

LEFT = [[1] * 7, [0] * 3 + [1] * 4]  # batch row 1: keys 3..6 live
RIGHT = [[1] * 7, [1] * 5 + [0] * 2]  # batch row 1: keys 0..4 live
SPANS = {"left": [(0, 7), (3, 7)], "right": [(0, 7), (0, 5)]}  # each batch row's live keys [s, e)


def _attention(m, impl: str) -> AttentionSpy:  # noqa: ANN001
    """The tiny Llama's attention calls and its own attention output (o_proj's input) for each."""
    import transformers.models.llama.modeling_llama as ml

    return AttentionSpy(m, impl, ml, [layer.self_attn.o_proj for layer in m.model.layers])


def _run(impl: str, mask: list[list[int]], decode: bool = False):  # noqa: ANN202
    """Capture a padded prefill (and, with `decode`, only the one-token step after it) of the tiny Llama."""
    m = load_llama_tiny(impl).module
    am = torch.tensor(mask)
    ids = torch.randint(1, 999, am.shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        if decode:
            past = m(input_ids=ids, attention_mask=am, use_cache=True).cache
            am = torch.cat([am, torch.ones(am.shape[0], 1, dtype=am.dtype)], 1)
            ids = ids[:, -1:]
        with _attention(m, impl) as seen, capture(m, sample_rate=1.0, capacity=100) as rec:
            if decode:
                m(input_ids=ids, attention_mask=am, cache=past, use_cache=True)
            else:
                m(input_ids=ids, attention_mask=am)
    return rec, seen


def _replay(inputs: dict[str, torch.Tensor], causal: bool) -> torch.Tensor:
    return reference({n: t.double() for n, t in inputs.items()}, {"causal": causal})


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("padding", ["left", "right"])
def test_a_padded_prefill_records_each_row_over_its_live_keys(impl: str, padding: str) -> None:
    """Per layer, one causal record per batch row: its q, k, v the model's rows [b, :, s:e], its sketch theirs,
    and its float64 replay the model's own attention output for those rows. The old record (the whole batch,
    causal over every key) replayed batch row 1 of the left-padded batch with its queries seeing the pad keys."""
    rec, seen = _run(impl, LEFT if padding == "left" else RIGHT)
    spans = SPANS[padding]
    att = [r for r in rec.records() if r["op"] == "attention"]
    kept = [s for s in rec.all_samples() if s.op == "attention"]
    layers = len(seen.qkv)
    assert layers == 2 and len(att) == len(kept) == layers * len(spans) and not rec.skipped
    for call, ((q, k, v), out) in enumerate(zip(seen.qkv, seen.out)):
        for b, (s, e) in enumerate(spans):
            r, smp = att[call * len(spans) + b], kept[call * len(spans) + b]
            rows = (slice(b, b + 1), slice(None), slice(s, e))
            for name, t in (("q", q), ("k", k), ("v", v)):
                assert torch.equal(smp.inputs[name], t[rows]), (call, b, name)
            assert r["params"] == smp.params == {"causal": True}
            assert (r["sketch"]["batch"], r["sketch"]["seq_q"], r["sketch"]["seq_k"]) == (1, e - s, e - s)
            assert r["sketch"]["absmax"] == pytest.approx(float(torch.cat([q[rows], k[rows]]).abs().max()))
            torch.testing.assert_close(_replay(smp.inputs, True), out[rows].double(), rtol=1e-5, atol=1e-5)
        old = _replay({"q": q, "k": k, "v": v}, True)[:, :, 3:] if padding == "left" else None
        if old is not None:  # batch row 0 unpadded: the old record was right there, and wrong for row 1
            torch.testing.assert_close(old[0], out[0, :, 3:].double(), rtol=1e-5, atol=1e-5)
            assert not torch.allclose(old[1], out[1, :, 3:].double(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_a_left_padded_decode_step_records_each_row_over_its_live_keys(impl: str) -> None:
    """One token after a left-padded prefill (one mask row: every query sees the row's live keys): per layer one
    non-causal record per batch row, its one query over keys [s:8], replaying the model's output. It was one
    non-causal record over all 8 keys, batch row 1's query seeing its 3 pad keys."""
    rec, seen = _run(impl, LEFT, decode=True)
    att = [r for r in rec.records() if r["op"] == "attention"]
    kept = [s for s in rec.all_samples() if s.op == "attention"]
    assert len(seen.qkv) == 2 and len(att) == len(kept) == 4 and not rec.skipped
    for call, ((q, k, v), out) in enumerate(zip(seen.qkv, seen.out)):
        for b, s in enumerate((0, 3)):
            r, smp = att[2 * call + b], kept[2 * call + b]
            assert torch.equal(smp.inputs["q"], q[b:b + 1])
            assert torch.equal(smp.inputs["k"], k[b:b + 1, :, s:]) and torch.equal(smp.inputs["v"], v[b:b + 1, :, s:])
            assert r["params"] == {"causal": False} and (r["sketch"]["seq_q"], r["sketch"]["seq_k"]) == (1, 8 - s)
            torch.testing.assert_close(_replay(smp.inputs, False), out[b:b + 1].double(), rtol=1e-5, atol=1e-5)
        old = _replay({"q": q, "k": k, "v": v}, False)
        assert not torch.allclose(old[1], out[1].double(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_live_keys_with_holes_are_skipped_and_counted(impl: str) -> None:
    """A batch row whose live keys are not one span has no catalog form: a prefill with a pad token inside a row
    (attention mask 1 1 0 1 1 1 1), and a right-padded batch's decode step (pad keys between the prompt and the
    new token). Each such call is skipped and counted, one per layer; the right-padded prefill before that step
    is recorded (test above)."""
    rec, _ = _run(impl, [[1] * 7, [1, 1, 0, 1, 1, 1, 1]])
    assert [r for r in rec.records() if r["op"] == "attention"] == [] and rec.skipped == {PADDING_HOLES_SKIP: 2}
    rec, _ = _run(impl, RIGHT, decode=True)
    assert [r for r in rec.records() if r["op"] == "attention"] == [] and rec.skipped == {PADDING_HOLES_SKIP: 2}
