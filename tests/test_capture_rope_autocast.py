"""Rope under torch.autocast is recorded in the dtype it computes in (float32), not q's bfloat16.

    python -m pytest -q tests/test_capture_rope_autocast.py

Under autocast(bfloat16) q and k come out of bfloat16 linears while HF's rotary module builds cos/sin
from the float32 hidden states, so x * cos + rotate_half(x) * sin runs in, and returns, float32. The
capture labelled the call bfloat16 (q's dtype) and the matcher assessed it against bfloat16's tolerance.
"""

from __future__ import annotations

import torch

from optwin.ingest.capture import capture

# transformers' modeling modules import triton: imported inside the tests, so a later test module can still
# set TRITON_INTERPRET=1 before triton's import (tests/_kernel_checks.py)


def _tf():  # noqa: ANN202
    import transformers
    return transformers


def _llama(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Built in `dtype` the way from_pretrained(dtype=...) builds it: the rotary inv_freq stays float32
    (model.to(dtype) would round it, and its rope is then not the catalog's: skipped)."""
    torch.manual_seed(0)
    cfg = _tf().LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, attn_implementation="eager")
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return _tf().LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(before)


def _ropes(m: torch.nn.Module, autocast: bool):  # noqa: ANN202
    ids = torch.randint(1, 100, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), \
            capture(m, sample_rate=1.0) as rec:
        m(input_ids=ids)
    return ([r["dtype"] for r in rec.records() if r["op"] == "rope"],
            [s.inputs["x"].dtype for s in rec.all_samples() if s.op == "rope"])


def test_autocast_rope_is_recorded_as_float32() -> None:
    dtypes, xs = _ropes(_llama(), autocast=True)
    assert dtypes == ["float32", "float32"] and xs == [torch.float32, torch.float32]


def test_bfloat16_model_rope_stays_bfloat16() -> None:
    # without autocast the tables are cast to the hidden states' bfloat16: the call is bfloat16
    dtypes, xs = _ropes(_llama(torch.bfloat16), autocast=False)
    assert dtypes == ["bfloat16", "bfloat16"] and xs == [torch.bfloat16, torch.bfloat16]
