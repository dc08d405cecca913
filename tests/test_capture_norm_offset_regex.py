"""Only norms whose forward computes 1 + self.weight are recorded with the effective weight 1 + w.

    python -m pytest -q tests/test_capture_norm_offset_regex.py

The source pattern had no boundaries: `1 + self.weight_scale` and `0.1 + self.weight` matched (their
norms were recorded with a weight of 1 + w they never compute), and `self.weight + 1` did not.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optwin.ingest.capture import _OFFSET_RE, capture

ONE_PLUS_W = {  # forward source -> the cast the sum is computed under
    "output * (1.0 + self.weight.float())": ".float()",  # Gemma3RMSNorm
    "x * (1 + self.weight)": None,
    "x*(1.+self.weight.to(torch.float32))": ".to(torch.float32)",
    "x * (self.weight + 1.0)": None,
    "x * (self.weight.float() + 1)": ".float()",
    "x * (1.0 + self.weight).to(x.dtype)": None,
}
NOT_ONE_PLUS_W = ["x * (1 + self.weight_scale)", "x * (0.1 + self.weight)", "x * (11 + self.weight)",
                  "x * (self.weight + 1e-6)", "x * (self.weight + 1.5)", "x * (self.weight + 10)",
                  "x * (1 + self.weight * s)", "x * (1 + self.weight.float() * s)", "x * (self.weight + 1 * s)",
                  "x * (1 + myself.weight)", "x * self.weight"]


@pytest.mark.parametrize("src", list(ONE_PLUS_W))
def test_one_plus_weight_matches_either_order(src: str) -> None:
    m = _OFFSET_RE.search(src)
    assert m is not None and (m.group("c1") or m.group("c2")) == ONE_PLUS_W[src]


@pytest.mark.parametrize("src", NOT_ONE_PLUS_W)
def test_other_sums_do_not_match(src: str) -> None:
    assert _OFFSET_RE.search(src) is None


class ScaleRMSNorm(nn.Module):  # scales by w * (1 + a second parameter): its weight is w
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight, self.weight_scale = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * x * (1 + self.weight_scale)


class OffsetLastRMSNorm(nn.Module):  # Gemma's 1 + w written the other way round
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (self.weight + 1.0)


@pytest.mark.parametrize("cls,offset", [(ScaleRMSNorm, False), (OffsetLastRMSNorm, True)])
def test_llama_final_norm_records_the_weight_it_computes(cls: type, offset: bool) -> None:
    import transformers  # imported here: transformers imports triton (tests/_kernel_checks.py)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2)
    m = transformers.LlamaForCausalLM(cfg).eval()
    m.model.norm = cls(64)
    with torch.no_grad():
        m.model.norm.weight.uniform_(-3.0, 1.0)
        with capture(m, sample_rate=1.0, capacity=100) as rec:
            m(input_ids=torch.randint(1, 100, (1, 10), generator=torch.Generator().manual_seed(1)))
    final = [s for s in rec.all_samples() if s.op == "rmsnorm" and s.stream == "model.norm"]
    w = m.model.norm.weight
    assert final and torch.equal(final[0].inputs["weight"], 1.0 + w if offset else w)
