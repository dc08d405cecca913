"""A rotary module whose only record of its base is its inv_freq buffer still has its ropes recorded.

    python -m pytest -q tests/test_capture_rope_base_from_inv.py

With no config and no `base` attribute the base is derived as inv[1] ** -n, which multiplies inv[1]'s
float32 rounding n times (head dim 128, base 1e4: 9999.978). _rope_reason rebuilt the catalog's table
for that base, found it a few ppm off the buffer and skipped the rope ("inv_freq is not the catalog's
for base 9999.98"): every such call was lost.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optwin.ingest.capture import Recorder, _rope_base, _rope_reason, capture


class MyRotaryEmbedding(nn.Module):  # HF's inv_freq formula, and nothing else saying the base
    def __init__(self, d: int, base: float) -> None:
        super().__init__()
        exps = torch.arange(0, d, 2, dtype=torch.int64).float() / d
        self.register_buffer("inv_freq", 1.0 / (base ** exps), persistent=False)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("base", [1e4, 5e5, 1e6])
def test_base_derived_from_inv_freq_is_the_modules(d: int, base: float) -> None:
    m, rec = MyRotaryEmbedding(d, base), Recorder.__new__(Recorder)
    rec._rope_checked = {}
    assert _rope_base(m) == base
    assert _rope_reason(rec, m, base) is None


def test_scaled_inv_freq_without_a_base_is_still_skipped() -> None:
    # linear scaling divides every frequency (inv[0] is then not 1): no rounded base gives that table
    m, rec = MyRotaryEmbedding(128, 1e4), Recorder.__new__(Recorder)
    m.inv_freq.div_(8.0)
    rec._rope_checked = {}
    assert _rope_reason(rec, m, _rope_base(m)).startswith("rope: inv_freq is not the catalog's for base")


def test_llama_rotary_without_config_is_recorded_with_its_base() -> None:
    import transformers  # imported here: transformers imports triton (tests/_kernel_checks.py)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=256, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2,
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                   attn_implementation="eager")
    m = transformers.LlamaForCausalLM(cfg).eval()
    m.model.rotary_emb.config = None  # head dim 128: the base is only in inv_freq
    with torch.no_grad(), capture(m) as rec:
        m(input_ids=torch.randint(1, 100, (1, 12), generator=torch.Generator().manual_seed(1)))
    ropes = [r for r in rec.records() if r["op"] == "rope"]
    assert [r["params"] for r in ropes] == [{"base": 10000.0}] * 2 and not dict(rec.skipped)
