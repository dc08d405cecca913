"""A partial-rotary call (cos/sin narrower than q) is skipped and counted, not recorded as full-width rope.

    python -m pytest -q tests/test_capture_s48b_partial_rotary.py

Phi-3 (partial_rotary_factor), GPT-NeoX / Pythia (rotary_pct), StableLM and Phi-2 hand
apply_rotary_pos_emb the whole q with tables for its first dims only: the call rotates those and passes
the rest through. Recorded as the catalog's rope (which rotates every dim of x), the twin's reference was
0.6 off the model's output. A full-width model (Llama) stays recorded.
"""

from __future__ import annotations

import pytest
import torch

from optwin.ingest.capture import PARTIAL_ROTARY_SKIP, capture

_COMMON = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4)


def _config(name: str):  # noqa: ANN202
    import transformers as T  # imported here: see test_capture_inference_mode

    if name == "phi3":
        return T.Phi3Config(**_COMMON, num_key_value_heads=4, partial_rotary_factor=0.5, pad_token_id=0)
    if name == "gpt_neox":
        return T.GPTNeoXConfig(**_COMMON, rotary_pct=0.5)
    return T.LlamaConfig(**_COMMON, num_key_value_heads=4)


@pytest.mark.parametrize("name", ["phi3", "gpt_neox", "llama"])
def test_partial_rotary_is_skipped(name: str) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(_config(name)).eval()
    ids = torch.randint(1, 999, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), capture(m, sample_rate=1.0, capacity=100) as rec:
        m(input_ids=ids)
    rope = [r for r in rec.records() if r["op"] == "rope"]
    if name == "llama":
        assert len(rope) == 4 and PARTIAL_ROTARY_SKIP not in rec.skipped  # q and k of 2 layers
    else:
        assert rope == [] and rec.skipped[PARTIAL_ROTARY_SKIP] == 4
