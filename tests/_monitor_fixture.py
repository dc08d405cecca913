"""A float16 model whose norm overflows past |x| = 256, and its inputs, for the monitor's tests."""

from __future__ import annotations

import itertools

import torch
from torch import nn


class NativeRMSNorm(nn.Module):
    """T5LayerNorm-style: squares in the input dtype (the capture hooks classify it rmsnorm/native-dtype)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=torch.float16))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)  # (rows, 1) in float16: overflows past |x| = 256
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rows_of_absmax(g: torch.Generator, absmax: float) -> torch.Tensor:
    """(4, 64) float16 rows whose largest |x| is absmax."""
    x = torch.randn(4, 64, generator=g, dtype=torch.float64)  # (4, 64)
    return (x / x.abs().max() * absmax).half()


def fake_clock(step: float = 0.5):
    """A monitor clock that advances `step` seconds a reading."""
    tick = itertools.count()
    return lambda: step * next(tick)


def eager_llama(theta: float, seed: int) -> nn.Module:
    """A one-layer eager Llama (hidden 64, 2 heads) with rope base `theta`, for tests that run two models' monitors."""
    import transformers  # imports triton: after the test module has set TRITON_INTERPRET

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1 << 20,
                                   rope_parameters={"rope_type": "default", "rope_theta": theta},
                                   attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg).eval()
