"""A patched RMSNorm whose weight is wider than its input (float32 weight, bfloat16 activations) keeps HF's result.

    python -m pytest -q tests/test_patch_rms_mixed.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402

import optwin.kernels  # noqa: E402


def test_a_float32_weight_on_bfloat16_activations_gives_hfs_float32_result():
    """HF's Qwen3 q/k norms under autocast (or modules kept in float32) see bfloat16 activations with a float32
    weight: HF multiplies in float32 (weight * h.to(bf16), a float32 result); rounding the weight and the product to
    bfloat16 is up to 1 % off. A weight no wider than the input (float32 activations, bfloat16 weight) still runs
    the kernel, exactly: the weight converts without loss."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    norm = Qwen3RMSNorm(64)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.3, 3.1, 64))  # non-trivial: weights far from 1 show their rounding
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))  # (8, 64)
    with torch.no_grad():
        ref = norm(x.bfloat16())
        with optwin.kernels.patch(norm) as h:
            got = norm(x.bfloat16())
        norm.bfloat16()
        ref_up = norm(x)  # a bfloat16 weight on float32 activations: HF multiplies in float32
        with optwin.kernels.patch(norm) as h_up:
            got_up = norm(x)
    assert got.dtype == ref.dtype == torch.float32
    rel = ((got - ref).abs() / ref.abs().clamp_min(1e-3)).max().item()
    assert rel < 1e-6, f"patched RMSNorm is {rel:.2%} off HF's"
    assert h.calls["rmsnorm"] == 0  # the model's code, not the kernel's approximation of it
    assert h_up.calls == {"rmsnorm": 1} and got_up.dtype == ref_up.dtype == torch.float32
    assert torch.allclose(got_up, ref_up, rtol=1e-5, atol=1e-5)
