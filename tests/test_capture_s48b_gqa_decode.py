"""A GQA decode step that sdpa runs packed (HF's pack_gqa) is recorded, non-causal over its used keys.

    python -m pytest -q tests/test_capture_s48b_gqa_decode.py

With a mask (a static cache's, or a padded batch's), transformers runs a single-token GQA step as
q (b, kv_heads, n_rep, d) over k (b, kv_heads, seq_k, d) with the mask (b, 1, 1, seq_k): n_rep query
rows that are one token's heads, one mask row for all of them. The capture read n_rep as a token
count and the call as a cached multi-token step (bottom-right causal), and skipped every such decode
step. One mask row means every query row sees the same keys: the call is the catalog's non-causal
attention over the keys the row allows (the same computation, n_rep rows of it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from optwin.ingest.capture import BOTTOM_RIGHT_SKIP, capture
from optwin.twin.attention import reference


def _gqa_llama():  # noqa: ANN202
    from transformers import AutoModelForCausalLM, LlamaConfig  # imported here: see test_capture_inference_mode

    cfg = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      attn_implementation="sdpa", pad_token_id=0)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval()


class _Spy:
    """torch's own sdpa outputs, with the mask the model passed: what each kept case must replay."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __enter__(self) -> _Spy:
        self.orig = F.scaled_dot_product_attention

        def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            out = self.orig(*args, **kwargs)
            self.calls.append((args[0] if args else kwargs["query"], out))
            return out

        F.scaled_dot_product_attention = spy
        return self

    def __exit__(self, *exc: object) -> None:
        F.scaled_dot_product_attention = self.orig


def _generate(m, ids, **kw):  # noqa: ANN001, ANN003, ANN202
    with _Spy() as spy, torch.no_grad(), capture(m, sample_rate=1.0, capacity=100) as rec:
        m.generate(ids, max_new_tokens=4, do_sample=False, **kw)
    return spy, rec


def _replays(spy: _Spy, rec, rows: slice = slice(None)) -> None:  # noqa: ANN001
    """Each kept case, through the twin's float64 reference, is the model's own sdpa output (batch `rows`)."""
    kept = [s for s in rec.all_samples() if s.op == "attention"]
    assert kept
    for s in kept:
        want = next(out for q, out in spy.calls if q.shape == s.inputs["q"].shape and torch.equal(q, s.inputs["q"]))
        got = reference({n: t.double() for n, t in s.inputs.items()}, s.params)
        torch.testing.assert_close(got[rows], want.double()[rows], rtol=1e-5, atol=1e-5)


def test_static_cache_gqa_decode_steps_are_recorded() -> None:
    m = _gqa_llama()
    ids = torch.randint(1, 999, (2, 9), generator=torch.Generator().manual_seed(0))
    spy, rec = _generate(m, ids, cache_implementation="static")
    att = [(r["sketch"]["seq_k"], r["params"]["causal"]) for r in rec.records() if r["op"] == "attention"]
    # prefill causal over 9 keys, then 3 decode steps over 10, 11, 12 used keys (packed: 2 query rows each)
    assert att == [(9, True)] * 2 + [(n, False) for n in (10, 11, 12) for _ in range(2)]
    assert BOTTOM_RIGHT_SKIP not in rec.skipped
    assert any(s.inputs["q"].shape[1:3] == (2, 2) for s in rec.all_samples() if s.op == "attention")  # packed
    _replays(spy, rec)

