"""torch.addmm is a matmul: GPT-2's Conv1D projections are recorded (a tiny random-weight GPT-2, offline).

    python -m pytest -q tests/test_ingest_capture_addmm.py
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from optwin.ingest.capture import capture


def _gpt2(attn: str) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=500, n_embd=64, n_layer=2, n_head=4, n_positions=64, attn_implementation=attn,
                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_gpt2_conv1d_projections_are_matmuls(attn: str) -> None:
    from transformers.pytorch_utils import Conv1D

    m = _gpt2(attn)
    ids = torch.randint(1, 500, (2, 10), generator=torch.Generator().manual_seed(1))
    calls: Counter[str] = Counter()  # forward calls of the model's Linear / Conv1D modules, by path
    handles = [mod.register_forward_hook(lambda mod, a, o, p=path: calls.update([p]))
               for path, mod in m.named_modules() if isinstance(mod, (nn.Linear, Conv1D))]
    with torch.no_grad():
        ref = m(input_ids=ids).logits
        calls.clear()
        with capture(m) as rec:
            got = m(input_ids=ids).logits
    for h in handles:
        h.remove()
    assert torch.equal(ref, got)  # capture never changes outputs
    mm = [r for r in rec.records() if r["op"] == "matmul"]
    assert sum(calls.values()) == 9 and len(mm) == 9, (calls, Counter(r["stream"] for r in mm), rec.skipped)
    assert Counter(r["stream"] for r in mm) == calls  # one record per projection, under its module's path
    c_fc = next(r for r in mm if r["stream"] == "transformer.h.0.mlp.c_fc")
    assert c_fc["sketch"]["m"] == 20 and c_fc["sketch"]["k"] == 64 and c_fc["sketch"]["n"] == 256, c_fc["sketch"]


def test_addmm_scaled_is_skipped_with_reason() -> None:
    g = torch.Generator().manual_seed(2)
    bias, a, b = torch.randn(8, generator=g), torch.randn(4, 16, generator=g), torch.randn(16, 8, generator=g)
    with capture() as rec:
        y0 = torch.addmm(bias, a, b, beta=0)  # plain product: recorded
        y1 = bias.addmm(a, b)  # Tensor.addmm: recorded
        torch.addmm(bias, a, b, alpha=0.5)  # a scaled product: not a catalog matmul
    assert torch.allclose(y0, a @ b) and torch.allclose(y1, bias + a @ b, atol=1e-6)
    assert [r["op"] for r in rec.records()] == ["matmul", "matmul"]
    assert sum(n for k, n in rec.skipped.items() if k.startswith("matmul: addmm with alpha")) == 1, rec.skipped
