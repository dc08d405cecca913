"""Ropes keyed per layer type (Gemma3: sliding 1e4, full 1e6) are recorded with each layer's own base.

    python -m pytest -q tests/test_capture_rope_layer_types.py

Gemma3's config has rope_parameters per layer type and no top-level rope_theta, and its rotary module
builds one (cos, sin) per layer type before the layers run. The capture found no rope_theta and
recorded every layer's rope with base 10000.0; now each apply_rotary_pos_emb call takes the base of the
table its cos came from.
"""

from __future__ import annotations

import torch

from optwin.ingest.capture import capture

# transformers' modeling modules import triton: imported inside the tests, so a later test module can still
# set TRITON_INTERPRET=1 before triton's import (tests/_kernel_checks.py)


def _tf():  # noqa: ANN202
    import transformers
    return transformers


def _gemma(**rope: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = _tf().Gemma3TextConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=16,
                           layer_types=["sliding_attention", "full_attention"], attn_implementation="eager", **rope)
    return _tf().Gemma3ForCausalLM(cfg).eval()


def _ropes(m: torch.nn.Module):  # noqa: ANN202
    with torch.no_grad(), capture(m) as rec:
        m(input_ids=torch.randint(1, 100, (1, 20), generator=torch.Generator().manual_seed(1)))
    return {(r["stream"], r["params"]["base"]) for r in rec.records() if r["op"] == "rope"}, dict(rec.skipped)


def test_each_layer_type_records_its_own_base() -> None:
    m = _gemma()
    assert m.config.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    assert m.config.rope_parameters["full_attention"]["rope_theta"] == 1000000.0
    ropes, skipped = _ropes(m)
    assert ropes == {("model.layers.0.self_attn:q", 10000.0), ("model.layers.0.self_attn:k", 10000.0),
                     ("model.layers.1.self_attn:q", 1000000.0), ("model.layers.1.self_attn:k", 1000000.0)}
    assert not any(why.startswith("rope") for why in skipped)


def test_a_scaled_layer_type_is_skipped_and_the_other_recorded() -> None:
    m = _gemma(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})
    ropes, skipped = _ropes(m)
    assert ropes == {("model.layers.0.self_attn:q", 10000.0), ("model.layers.0.self_attn:k", 10000.0)}
    assert skipped["rope: scaled rope_type linear is not a catalog variant"] == 2
