"""A left-padded prefill over a static KV cache is recorded per batch row over its live keys.

    python -m pytest -q tests/test_capture_s49_static_padding.py

A static cache hands attention all of its max_cache_len slots, the unwritten ones masked in every batch row. The
padding check aligned its causal mask bottom-right to that full length (query i seeing keys j <= i + 3 on 7 queries
and 10 slots), so a left-padded batch's prefill, whose query i sees its row's live keys j <= i, matched nothing and
was skipped under MASK_SKIP as a sliding window. The check now also aligns to the last live key (the written slots).
The decode steps after it were already recorded per row.
"""

from __future__ import annotations

import pytest
import torch
from _attention_spy import AttentionSpy

from optwin.ingest.capture import capture
from optwin.ingest.models import load_llama_tiny
from optwin.twin.attention import reference

LEFT = [[1] * 7, [0] * 3 + [1] * 4]  # batch row 1: keys 3..6 live
SPANS = [(0, 7), (3, 7)]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_a_left_padded_static_cache_prefill_records_each_row_over_its_live_keys(impl: str) -> None:
    """The prefill: per layer one causal record per batch row, its q, k, v the model's [b, :, s:e] (the unwritten
    slots 7..9 dropped), replaying in float64 the model's own attention output for those rows; then the two
    decode steps, one query per row over its live keys, as before. Nothing skipped."""
    import transformers.models.llama.modeling_llama as ml

    m = load_llama_tiny(impl).module
    am = torch.tensor(LEFT)
    ids = torch.randint(1, 999, am.shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), AttentionSpy(m, impl, ml, [layer.self_attn.o_proj for layer in m.model.layers]) as seen, \
            capture(m, sample_rate=1.0, capacity=100) as rec:
        m.generate(ids, attention_mask=am, max_new_tokens=3, do_sample=False, cache_implementation="static",
                   pad_token_id=0)
    att = [r for r in rec.records() if r["op"] == "attention"]
    kept = [s for s in rec.all_samples() if s.op == "attention"]
    layers = m.config.num_hidden_layers
    assert not rec.skipped, rec.skipped
    assert [(r["sketch"]["batch"], r["sketch"]["seq_q"], r["sketch"]["seq_k"], r["params"]["causal"]) for r in att] == (
        [(1, 7, 7, True), (1, 4, 4, True)] * layers + [(1, 1, 8, False), (1, 1, 5, False)] * layers
        + [(1, 1, 9, False), (1, 1, 6, False)] * layers)
    for call in range(layers):  # the prefill's calls
        (q, k, v), out = seen.qkv[call], seen.out[call]
        assert q.shape[2] == 7 and k.shape[2] > 7  # the static cache's slots, more than the written ones
        for b, (s, e) in enumerate(SPANS):
            smp = kept[call * len(SPANS) + b]
            rows = (slice(b, b + 1), slice(None), slice(s, e))
            for name, t in (("q", q), ("k", k), ("v", v)):
                assert torch.equal(smp.inputs[name], t[rows]), (call, b, name)
            got = reference({n: t.double() for n, t in smp.inputs.items()}, {"causal": True})
            torch.testing.assert_close(got, out[rows].double(), rtol=1e-5, atol=1e-5)
