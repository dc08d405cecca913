"""optwin.kernels.patch on a tiny random-weight transformers Llama under TRITON_INTERPRET=1.

    python -m pytest -q tests/test_kernels_patch.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import optwin.kernels  # noqa: E402


def _tiny_llama(dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager",
    )
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():  # non-trivial norm weights, so a dropped weight would show
        for m in model.modules():
            if type(m).__name__ == "LlamaRMSNorm":
                m.weight.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-4), (torch.bfloat16, 6e-2)])
def test_patched_llama_matches_unpatched_and_undoes(dtype, atol):
    model = _tiny_llama(dtype)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits.float()
        handle = optwin.kernels.patch(model)
        got = model(ids).logits.float()
        handle.undo()
        again = model(ids).logits.float()
    # 2 layers: 2 norms each + final norm; q and k rotated per layer; one softmax per layer
    assert handle.calls == {"rmsnorm": 5, "rope": 4, "softmax": 2}
    err = (got - ref).abs().max().item()
    assert err < atol, f"patched logits differ by {err}"
    assert torch.equal(again, ref)  # undo restored the original operators
    from transformers.models.llama import modeling_llama

    assert modeling_llama.apply_rotary_pos_emb.__module__ == modeling_llama.__name__


def test_patch_swaps_layernorm_and_works_as_context_manager():
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(16, 48), nn.LayerNorm(48), nn.GELU(), nn.LayerNorm(48))
    with torch.no_grad():
        net[1].weight.uniform_(0.5, 2.0)
        net[3].bias.uniform_(-1, 1)
        x = torch.randn(5, 16)
        ref = net(x)
        with optwin.kernels.patch(net) as h:
            got = net(x)
        assert h.calls == {"layernorm": 2}
        assert "forward" not in net[1].__dict__
    assert torch.allclose(got, ref, atol=1e-5)


def test_patched_phi_with_partial_rotary_matches_unpatched():
    """Phi rotates a slice of each head (partial_rotary_factor) and normalizes with biased LayerNorms: the
    patched model runs our rope on the slices, our layernorm and softmax, with the model's logits."""
    from transformers import PhiConfig, PhiForCausalLM

    torch.manual_seed(0)
    cfg = PhiConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, max_position_embeddings=64, partial_rotary_factor=0.5,
                    attn_implementation="eager")
    model = PhiForCausalLM(cfg).eval()
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
        with optwin.kernels.patch(model) as h:
            got = model(ids).logits
    assert h.calls == {"rope": 4, "layernorm": 3, "softmax": 2}
    assert (got - ref).abs().max().item() < 1e-4
