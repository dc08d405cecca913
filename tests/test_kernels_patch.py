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


def _tiny(config_cls, model_cls, **kw):
    torch.manual_seed(0)
    cfg = config_cls(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, max_position_embeddings=64, attn_implementation="eager", **kw)
    model = model_cls(cfg).eval()
    with torch.no_grad():  # Gemma's norms start at w = 0, where x * (1 + w) and x * w differ the most
        for m in model.modules():
            if type(m).__name__.endswith("RMSNorm"):
                m.weight.uniform_(-0.5, 0.5)
    return model


def test_gemma_norms_and_gemma2_softcapped_attention_keep_their_own_code():
    """GemmaRMSNorm computes x * (1 + w) and Gemma2's eager attention soft-caps its scores: neither is the kernel's
    maths, so patch leaves them alone (and the logits as they were); the rotaries are Llama's and are swapped."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, GemmaConfig, GemmaForCausalLM

    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    for model in (_tiny(GemmaConfig, GemmaForCausalLM),
                  _tiny(Gemma2Config, Gemma2ForCausalLM, attn_logit_softcapping=5.0, query_pre_attn_scalar=16)):
        with torch.no_grad():
            ref = model(ids).logits
            with optwin.kernels.patch(model) as h:
                got = model(ids).logits
        assert h.calls["rmsnorm"] == 0 and h.calls["rope"] == 4, (type(model).__name__, h.calls)
        assert (got - ref).abs().max().item() < 1e-4, type(model).__name__
    assert h.calls["softmax"] == 0  # Gemma2: soft-capped scores are not the kernel's softmax input


def test_torch_rms_norm_with_the_dtype_eps_and_a_2d_shape():
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(16, 32), nn.RMSNorm(32), nn.Linear(32, 24), nn.Unflatten(1, (4, 6)), nn.RMSNorm([4, 6]))
    x = torch.randn(5, 16)
    with torch.no_grad():
        net[1].weight.uniform_(0.5, 1.5)
        ref = net(x)
        with optwin.kernels.patch(net) as h:  # eps=None: float32's machine epsilon for fp32/bf16/fp16 inputs, as torch's own
            got = net(x)
    assert h.calls == {"rmsnorm": 1}  # the 2-D normalized shape keeps torch's code
    assert torch.allclose(got, ref, atol=1e-5)


def test_patching_a_half_precision_torch_rms_norm_warns_of_nothing():
    """patch's probe runs a float32 input through the bfloat16 module: torch's dtype-mismatch warning is the
    probe's, not the caller's, and the module is still swapped."""
    import warnings

    net = nn.Sequential(nn.Linear(8, 16), nn.RMSNorm(16)).to(torch.bfloat16)
    with warnings.catch_warnings(record=True) as seen, torch.no_grad():
        warnings.simplefilter("always")
        with optwin.kernels.patch(net) as h:
            net(torch.randn(3, 8, dtype=torch.bfloat16))
    assert h.calls == {"rmsnorm": 1}
    assert [str(w.message) for w in seen if "dtype" in str(w.message).lower()] == []


def test_calls_that_need_gradients_run_the_models_own_code():
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(16, 48), nn.LayerNorm(48), nn.GELU(), nn.Linear(48, 1))
    x = torch.randn(5, 16)
    net(x).sum().backward()
    ref = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    with optwin.kernels.patch(net) as h:
        net(x).sum().backward()  # the kernels have no backward: torch's layer_norm records the graph
        assert h.calls["layernorm"] == 0
        with torch.no_grad():
            net(x)
        assert h.calls["layernorm"] == 1
    for p, r in zip(net.parameters(), ref):
        assert p.grad is not None and torch.allclose(p.grad, r, atol=1e-6)


def test_patching_twice_and_undoing_in_either_order_restores_the_model():
    model = _tiny_llama(torch.float32)
    from transformers.models.llama import modeling_llama

    originals = (modeling_llama.apply_rotary_pos_emb, modeling_llama.eager_attention_forward)
    h1 = optwin.kernels.patch(model)
    h2 = optwin.kernels.patch(model)  # everything is held by h1: h2 is empty
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids)
    assert h1.calls["rmsnorm"] == 5 and not h2.calls
    h1.undo()
    h2.undo()
    assert (modeling_llama.apply_rotary_pos_emb, modeling_llama.eager_attention_forward) == originals
    assert not any("forward" in m.__dict__ for m in model.modules())
    h3 = optwin.kernels.patch(model)  # free again once undone
    assert h3._undo
    h3.undo()


def test_a_patch_under_capture_leaves_its_rotary_and_attention_watch_in_place():
    from optwin.ingest.capture import capture

    model = _tiny_llama(torch.float32)
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with capture(model) as plain:
            model(ids)
        with capture(model) as rec, optwin.kernels.patch(model) as h:
            model(ids)
    assert h.calls["rope"] == 0 and h.calls["softmax"] == 0 and h.calls["rmsnorm"] == 5
    seen = lambda r, op: sum(1 for row in r.records() if row["op"] == op)  # noqa: E731
    for op in ("rope", "attention"):  # every call the capture saw without the patch, it sees with it
        assert seen(rec, op) == seen(plain, op) > 0, op
