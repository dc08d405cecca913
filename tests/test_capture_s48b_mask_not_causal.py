"""A causal module's mask that is not causal over a key prefix (a sliding window) is skipped and counted.

    python -m pytest -q tests/test_capture_s48b_mask_not_causal.py

A sliding-window prefill (Qwen2, window 4: row 11 sees keys 8..11) was recorded as the plain causal
mask over every key: the twin's reference was 0.2 off the model's output. The catalog's attention
takes no mask, so no case replays it. A decode step over a window's keys (all in view), a prefill
shorter than the window (plain causal) and a padded batch (as before) stay recorded.
"""

from __future__ import annotations

import pytest
import torch
from test_capture_s48b_gqa_decode import _gqa_llama, _replays, _Spy

from optwin.ingest.capture import MASK_SKIP, capture
from optwin.twin.attention import reference


def _sliding_qwen2(impl: str):  # noqa: ANN202
    from transformers import AutoModelForCausalLM, Qwen2Config  # imported here: see test_capture_inference_mode

    cfg = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                      use_sliding_window=True, sliding_window=4, max_window_layers=0,
                      layer_types=["sliding_attention"] * 2, attn_implementation=impl)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval()


def _attention(rec) -> list[tuple[int, int, bool]]:  # noqa: ANN001
    return [(int(r["sketch"]["seq_q"]), int(r["sketch"]["seq_k"]), r["params"]["causal"])
            for r in rec.records() if r["op"] == "attention"]


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_a_sliding_window_prefill_is_skipped(impl: str) -> None:
    m = _sliding_qwen2(impl)
    ids = torch.randint(1, 999, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), capture(m, sample_rate=1.0, capacity=100) as rec:
        m(input_ids=ids)
    assert _attention(rec) == [] and rec.skipped[MASK_SKIP] == 2
    with torch.no_grad(), capture(m, sample_rate=1.0, capacity=100) as rec:
        m(input_ids=ids[:, :3])  # shorter than the window: the plain causal mask
    assert _attention(rec) == [(3, 3, True)] * 2 and MASK_SKIP not in rec.skipped


def test_sliding_window_decode_steps_stay_recorded_and_replay_the_model() -> None:
    m = _sliding_qwen2("sdpa")
    ids = torch.randint(1, 999, (1, 12), generator=torch.Generator().manual_seed(0))
    with _Spy() as spy, torch.no_grad(), capture(m, sample_rate=1.0, capacity=100) as rec:
        m.generate(ids, max_new_tokens=3, do_sample=False)
    att = _attention(rec)
    assert rec.skipped[MASK_SKIP] == 2 and len(att) == 4 and all(sq == 1 and not c for sq, _, c in att)
    _replays(spy, rec)


def test_a_left_padded_gqa_batch_stays_recorded() -> None:
    """Padding is no sliding window: a left-padded batch's prefill stays causal and its packed GQA decode steps
    are recorded non-causal, not skipped as cached multi-token steps; each batch row over its live keys
    (test_capture_s49_padding: the padded row's 3 pad keys dropped), so every kept case replays its row's own
    sdpa output, the padded row's included."""
    m = _gqa_llama()
    ids = torch.randint(1, 999, (2, 9), generator=torch.Generator().manual_seed(0))
    am = torch.ones_like(ids)
    am[1, :3] = 0
    ids[1, :3] = 0
    with _Spy() as spy, torch.no_grad(), capture(m, sample_rate=1.0, capacity=100) as rec:
        m.generate(ids, attention_mask=am, max_new_tokens=4, do_sample=False)
    rows = [(9, 9, True), (6, 6, True)] * 2  # per layer: batch row 0, then row 1 over keys 3..8
    rows += [c for n in (10, 11, 12) for _ in range(2) for c in ((2, n, False), (2, n - 3, False))]
    assert _attention(rec) == rows
    assert not rec.skipped
    kept = [s for s in rec.all_samples() if s.op == "attention"]
    assert len(kept) == len(rows)
    for s in kept:  # its batch row's query rows (a suffix: left padding) in the model's call, and that row's output
        q = s.inputs["q"]
        b, off, out = next((b, qq.shape[2] - q.shape[2], out) for qq, out in spy.calls for b in range(qq.shape[0])
                           if qq.shape[2] >= q.shape[2] and torch.equal(qq[b:b + 1, :, qq.shape[2] - q.shape[2]:], q))
        got = reference({n: t.double() for n, t in s.inputs.items()}, s.params)
        torch.testing.assert_close(got, out[b:b + 1, :, off:].double(), rtol=1e-5, atol=1e-5)
