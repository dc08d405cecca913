"""The built-in llama-tiny in a 16-bit dtype keeps its rotary in float32, as a loaded checkpoint does, so its rope
calls are captured.

    python -m pytest -q tests/test_ingest_models_dtype.py

It was built in float32 and cast with .to(dtype), which rounds the rotary's inv_freq too; HF then builds its
angles from the rounded frequencies, not the catalog's, and capture rightly skips those calls ("rope: ... cast"):
`optwin capture --model llama-tiny` in float16 recorded no rope at all.
"""

from __future__ import annotations

import pytest
import torch

from optwin.ingest.capture import capture
from optwin.ingest.models import load_llama_tiny


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_llama_tiny_in_16_bit_keeps_float32_frequencies_and_its_rope_is_captured(dtype: torch.dtype) -> None:
    m = load_llama_tiny("sdpa", dtype=dtype).module
    assert m.dtype == dtype and m.model.rotary_emb.inv_freq.dtype == torch.float32
    ref = load_llama_tiny("sdpa").module.to(dtype)  # the same seeded weights as the float32 model, cast
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), ref.parameters()))
    with torch.no_grad(), capture(m) as rec:
        m(input_ids=torch.randint(1, 1000, (1, 10), generator=torch.Generator().manual_seed(2)))
    ropes = [r for r in rec.records() if r["op"] == "rope"]
    assert len(ropes) == 4 and {r["dtype"] for r in ropes} == {str(dtype).removeprefix("torch.")}  # q, k x 2 layers
    assert not any(k.startswith("rope") for k in rec.skipped)


def test_torch_rms_norm_module_is_the_float32_accumulating_variant() -> None:
    # nn.RMSNorm's forward is F.rms_norm, which computes 16-bit inputs in float32: it was labelled native-dtype (no
    # "float32" in its source), and an fp16 model using it got precision_loss warnings the fp32-acc twin denies
    from optwin.ingest.capture import classify_module

    assert classify_module(torch.nn.RMSNorm(8).half()) == ("rmsnorm", "fp32-acc")
    m = torch.nn.Sequential(torch.nn.RMSNorm(256)).half()
    with torch.no_grad(), capture(m) as rec:
        m(torch.randn(8, 256, generator=torch.Generator().manual_seed(0)).half() * 3000)
    assert [(r["op"], r["variant"], r["dtype"]) for r in rec.records()] == [("rmsnorm", "fp32-acc", "float16")]
