"""Scaled HF ropes are skipped with a reason, not recorded as the catalog's fp32-angles rope.

    python -m pytest -q tests/test_capture_rope_scaling.py

The catalog's rope (optwin.catalog, variant fp32-angles) builds cos/sin from (positions, base) alone.
HF's rope_type linear / llama3 / yarn / dynamic change the inverse frequencies or multiply cos/sin by
attention_scaling: they were recorded with only the base, and the model's cos differed from the
catalog's by up to 2.0, so the fingerprints were looked up for another computation.
"""

from __future__ import annotations

import pytest
import torch

from optwin.ingest.capture import capture

# transformers' modeling modules import triton: imported inside the tests, so a later test module can still
# set TRITON_INTERPRET=1 before triton's import (tests/_kernel_checks.py)


def _tf():  # noqa: ANN202
    import transformers
    return transformers

SCALED = {
    "linear": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256, "rope_theta": 500000.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 1024},
    "dynamic": {"rope_type": "dynamic", "factor": 8.0, "rope_theta": 10000.0},
}


def _llama(rope: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = _tf().LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                      rope_parameters=rope, attn_implementation="eager")
    return _tf().LlamaForCausalLM(cfg).eval()


def _run(m: torch.nn.Module):  # noqa: ANN202
    with torch.no_grad(), capture(m) as rec:
        m(input_ids=torch.randint(1, 100, (1, 12), generator=torch.Generator().manual_seed(1)))
    return [r for r in rec.records() if r["op"] == "rope"], dict(rec.skipped)


@pytest.mark.parametrize("kind", list(SCALED))
def test_scaled_rope_is_skipped_with_its_type(kind: str) -> None:
    ropes, skipped = _run(_llama(SCALED[kind]))
    assert ropes == []
    assert skipped == {f"rope: scaled rope_type {kind} is not a catalog variant": 2}  # q and k


@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_default_rope_is_recorded_with_its_base(base: float) -> None:
    ropes, skipped = _run(_llama({"rope_type": "default", "rope_theta": base}))
    assert [r["params"] for r in ropes] == [{"base": base}] * 2 and not skipped


def test_inverse_frequencies_other_than_the_catalogs_are_skipped() -> None:
    # a rotary module that says "default" but whose frequencies were scaled (no rope_type tells it);
    # the check's verdict is kept only while the buffer is unchanged
    m = _llama({"rope_type": "default", "rope_theta": 10000.0})
    ids = torch.randint(1, 100, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), capture(m) as rec:
        m(input_ids=ids)
        m.model.rotary_emb.inv_freq.mul_(0.125)
        m(input_ids=ids)
    assert len([r for r in rec.records() if r["op"] == "rope"]) == 2  # the first forward's q and k
    assert dict(rec.skipped) == {"rope: inv_freq is not the catalog's for base 10000": 2}


def test_a_model_cast_with_to_says_its_inv_freq_was_rounded() -> None:
    # model.to(bfloat16) rounds the rotary's inv_freq buffer too, and HF builds the angles from it: the
    # error grows with the position (head dim 32: cos off by 1.3e-3 at position 11, 0.36 by 2047)
    m = _llama({"rope_type": "default", "rope_theta": 10000.0}).to(torch.bfloat16)
    ropes, skipped = _run(m)
    assert ropes == []
    assert skipped == {"rope: inv_freq in bfloat16 (a model cast with .to()), not the catalog's float32": 2}
