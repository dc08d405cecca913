"""patch swaps a modeling module's eager attention only where its probes show Llama's maths; Idefics2's and
Idefics3's vision attention (no num_key_value_groups) run our softmax and give the model's output.

    python -m pytest -q tests/test_patch_eager_probe.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

import optwin.kernels  # noqa: E402


def _vision(family: str):
    """A 2-layer random-weight vision transformer of Idefics2 or Idefics3 (4 patches of 14 px), eager attention."""
    import importlib

    cfg_mod = importlib.import_module(f"transformers.models.{family}.configuration_{family}")
    model_mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    stem = family.capitalize()
    cfg = getattr(cfg_mod, f"{stem}VisionConfig")(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                  num_attention_heads=4, image_size=28, patch_size=14)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return getattr(model_mod, f"{stem}VisionTransformer")(cfg).eval()


@pytest.mark.parametrize("family", ["idefics2", "idefics3"])
def test_vision_attention_without_key_value_groups_runs_our_softmax(family):
    """Their eager_attention_forward has Llama's signature but repeats no key/value heads (their attention modules
    have no num_key_value_groups): the replacement repeats by getattr(module, "num_key_value_groups", 1) rather
    than raising AttributeError on every patched forward."""
    vit = _vision(family)
    px = torch.randn(1, 3, 28, 28, generator=torch.Generator().manual_seed(1))  # (B, C, H, W)
    with torch.no_grad():
        ref = vit(px).last_hidden_state
        with optwin.kernels.patch(vit) as h:
            got = vit(px).last_hidden_state
    assert h.calls["softmax"] == 2  # one per layer
    assert (got - ref).abs().max().item() < 1e-5


def test_an_attention_reading_a_module_attribute_beyond_llamas_keeps_its_code():
    """The probe calls the function on a module with only num_key_value_groups: one that reads more of its module
    (GPT-OSS's learned sinks, read from module.sinks) is not Llama's maths, whatever its signature."""
    from transformers.models.gpt_oss import modeling_gpt_oss
    from transformers.models.llama import modeling_llama

    from optwin.kernels.patching import _eager_like

    assert _eager_like(modeling_llama.eager_attention_forward)
    assert not _eager_like(modeling_gpt_oss.eager_attention_forward)
