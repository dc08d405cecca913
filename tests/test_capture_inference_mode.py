"""Capture under torch.inference_mode, of a model built there too: no version counters, no crash.

    python -m pytest -q tests/test_capture_inference_mode.py

The verdicts capture keeps per tensor (a static cache's mask, the rotary inv_freq, a Gemma norm's
1 + w) were keyed on `_version`, which tensors made under inference_mode do not have: the read raised
inside the wrapped eager attention and broke the model's forward.
"""

from __future__ import annotations

import torch

from optwin.ingest.capture import capture

# transformers' modeling modules import triton: imported inside the tests, so a later test module can still
# set TRITON_INTERPRET=1 before triton's import (tests/_kernel_checks.py)


def _tf():  # noqa: ANN202
    import transformers
    return transformers
from optwin.ingest.models import load_llama_tiny


def test_static_cache_generate_under_inference_mode() -> None:
    m = load_llama_tiny("eager").module
    ids = torch.randint(1, 999, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), capture(m) as rec:
        m.generate(input_ids=ids, max_new_tokens=2, do_sample=False, cache_implementation="static")
    att = [(r["sketch"]["seq_q"], r["sketch"]["seq_k"], r["params"]["causal"])
           for r in rec.records() if r["op"] == "attention"]
    assert att == [(12, 12, True)] * 2 + [(1, 13, False)] * 2
    assert len([r for r in rec.records() if r["op"] == "rope"]) == 8 and not rec.skipped


def test_a_model_built_under_inference_mode() -> None:
    cfg = _tf().Gemma3TextConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                           layer_types=["full_attention"], attn_implementation="eager")
    with torch.inference_mode():
        torch.manual_seed(0)
        m = _tf().Gemma3ForCausalLM(cfg).eval()
        assert m.model.norm.weight.is_inference() and m.model.rotary_emb.full_attention_inv_freq.is_inference()
        with capture(m) as rec:
            m(input_ids=torch.randint(1, 100, (1, 8)))
            m(input_ids=torch.randint(1, 100, (1, 8)))
    assert len([r for r in rec.records() if r["op"] == "rope"]) == 4
    assert {r["sketch"]["weight_absmax"] for r in rec.records() if r["op"] == "rmsnorm"} == {1.0}
