"""A cached multi-token attention step (bottom-right causal mask, seq_q < seq_k) is skipped and counted.

    python -m pytest -q tests/test_capture_s48_bottom_right_causal.py

Fed several new tokens on a KV cache (generate's chunked prefill, speculative decoding's verify), HF
masks query i to keys j <= seq_k - seq_q + i. The catalog's attention has a top-left causal flag
(optwin.twin.attention: query i sees keys j <= i) and no mask input, so no case replays that call; it
was recorded non-causal, its twin letting every query see every key.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import StaticCache

from optwin.ingest.capture import BOTTOM_RIGHT_SKIP, capture
from optwin.ingest.models import load_llama_tiny
from optwin.twin.attention import reference


def _attention(rec) -> list[tuple[int, int, bool]]:  # noqa: ANN001
    return [(int(r["sketch"]["seq_q"]), int(r["sketch"]["seq_k"]), r["params"]["causal"])
            for r in rec.records() if r["op"] == "attention"]


def _replays(rec) -> None:  # noqa: ANN001
    """Every kept attention case, replayed by the twin's float64 reference, is torch's sdpa with the
    mask the model used: causal is top-left (is_causal), and a non-causal case has every key in view."""
    kept = [s for s in rec.all_samples() if s.op == "attention"]
    assert kept
    for s in kept:
        q, k, v = (s.inputs[n].double() for n in ("q", "k", "v"))
        want = F.scaled_dot_product_attention(q, k, v, is_causal=s.params["causal"])
        torch.testing.assert_close(reference({"q": q, "k": k, "v": v}, s.params), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_a_three_token_step_on_an_eight_token_cache_is_skipped(impl: str) -> None:
    m = load_llama_tiny(impl).module
    layers = m.config.num_hidden_layers
    ids = torch.randint(1, 999, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), capture(m, sample_rate=1.0, capacity=100) as rec:
        past = m(input_ids=ids[:, :8], use_cache=True).past_key_values  # prefill: 8 x 8, causal
        past = m(input_ids=ids[:, 8:11], past_key_values=past, use_cache=True).past_key_values  # 3 x 11
        m(input_ids=ids[:, 11:], past_key_values=past, use_cache=True)  # one token: 1 x 12, every key
    assert _attention(rec) == [(8, 8, True)] * layers + [(1, 12, False)] * layers
    assert rec.skipped[BOTTOM_RIGHT_SKIP] == layers
    assert sum(r["op"] == "matmul" for r in rec.records()) == 3 * (7 * layers + 1)  # the step's other ops stay
    _replays(rec)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_a_three_token_step_on_a_static_cache_is_skipped(impl: str) -> None:
    """The static cache's mask also hides its unwritten slots (capture keeps the used keys): the 3-token
    step over 11 used keys of 16 slots is bottom-right causal over those 11."""
    m = load_llama_tiny(impl).module
    layers = m.config.num_hidden_layers
    ids = torch.randint(1, 999, (1, 11), generator=torch.Generator().manual_seed(1))
    cache = StaticCache(config=m.config, max_cache_len=16)
    with torch.no_grad(), capture(m, sample_rate=1.0, capacity=100) as rec:
        m(input_ids=ids[:, :8], past_key_values=cache, use_cache=True)
        m(input_ids=ids[:, 8:], past_key_values=cache, use_cache=True)
    assert _attention(rec) == [(8, 8, True)] * layers
    assert rec.skipped[BOTTOM_RIGHT_SKIP] == layers
    _replays(rec)


def test_neither_causal_flag_replays_a_bottom_right_mask() -> None:
    """Why the step is skipped: the twin's reference with causal False or True is not sdpa with the
    bottom-right mask such a step runs (torch's own is_causal, top-left, is the twin's True)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g, dtype=torch.float64) for n in (3, 11, 11))
    keep = torch.ones(3, 11, dtype=torch.bool).tril(11 - 3)  # query i sees keys j <= 8 + i
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    for causal in (False, True):
        got = reference({"q": q, "k": k, "v": v}, {"causal": causal})
        assert (got - want).abs().max() > 1e-3, causal
    torch.testing.assert_close(reference({"q": q, "k": k, "v": v}, {"causal": True}),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))
