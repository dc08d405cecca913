"""A patched model whose tensors the kernels cannot reach (CPU without TRITON_INTERPRET=1) runs its own code.

    python -m pytest -q tests/test_patch_off_device.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported; the test takes it away per call below

import torch  # noqa: E402
from torch import nn  # noqa: E402

import optwin.kernels  # noqa: E402


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval()


def test_cpu_calls_without_the_interpreter_keep_the_models_own_code(monkeypatch):
    """A CPU model (or CPU-offloaded layers) on a machine where the kernels need CUDA: every patched operator --
    RMSNorm, LayerNorm, rotary, eager attention -- falls back to the model's code, as float64 calls do, instead of
    raising InputError on each forward. The kernels read TRITON_INTERPRET per call, and so does the fallback."""
    model = _tiny_llama()
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(16, 48), nn.LayerNorm(48))
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref_logits, ref_y = model(ids).logits, net(x)
        with optwin.kernels.patch(model) as h, optwin.kernels.patch(net) as h_ln:
            monkeypatch.delenv("TRITON_INTERPRET")
            logits, y = model(ids).logits, net(x)
            monkeypatch.setenv("TRITON_INTERPRET", "1")
            model(ids), net(x)  # the same patch takes the calls where the kernels can run
    assert torch.equal(logits, ref_logits) and torch.equal(y, ref_y)
    assert h.calls == {"rmsnorm": 5, "rope": 4, "softmax": 2} and h_ln.calls == {"layernorm": 1}
