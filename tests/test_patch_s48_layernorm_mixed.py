"""A patched nn.LayerNorm whose weight/bias dtype is not its input's gives exactly what torch gives.

    python -m pytest -q tests/test_patch_s48_layernorm_mixed.py

torch's layer_norm takes a float16/bfloat16 input with float32 weight and bias on CPU (its mixed-type path:
normalises and applies the float32 affine in float32, one rounding to the input dtype) and refuses other mixes
(a float32 input with half parameters, bfloat16 with float16); CUDA's kernel refuses every mix (it reads the
parameters as the input's dtype), and under CUDA autocast it upcasts the input and returns float32. The patched
forward rounded the float32 weight and bias to the input dtype first (up to an ulp off the CPU result) and ran
the refused mixes instead of raising. It now leaves every mix to the module's own code: whatever torch does on
that device, the patched model does.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import optwin.kernels  # noqa: E402

HIDDEN = 96


def _outcome(fn):
    """fn()'s result, or its exception's type and first line: a refused mix must be refused the same way."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001  compared below, whatever torch raises
        return type(e), str(e).splitlines()[0]


@pytest.mark.parametrize("x_dtype,p_dtype,bias", [
    (torch.bfloat16, torch.float32, True),   # a LayerNorm kept in float32 under bfloat16 activations
    (torch.float16, torch.float32, True),
    (torch.bfloat16, torch.float32, False),  # nn.LayerNorm(bias=False): the zero bias in float32 too
    (torch.float32, torch.bfloat16, True),   # refused by torch: the patch must not answer instead
    (torch.bfloat16, torch.float16, True),
])
def test_mixed_parameter_dtypes_give_torchs_own_result(x_dtype, p_dtype, bias):
    ln = nn.LayerNorm(HIDDEN, bias=bias)
    with torch.no_grad():  # weights far from 1 and a bias: their rounding to bf16 shows in the output
        ln.weight.copy_(torch.linspace(0.3, 3.1, HIDDEN) + 1e-3)
        if bias:
            ln.bias.copy_(torch.linspace(-1.7, 1.3, HIDDEN) + 1e-3)
    ln.to(p_dtype)
    x = (torch.randn(7, HIDDEN, generator=torch.Generator().manual_seed(0)) * 3 + 0.5).to(x_dtype)  # (7, 96)
    with torch.no_grad():
        ref = _outcome(lambda: ln(x))
        with optwin.kernels.patch(ln) as h:
            got = _outcome(lambda: ln(x))
            same = _outcome(lambda: ln.to(x_dtype)(x))  # parameters in the input's dtype: the kernel's call
    if isinstance(ref, torch.Tensor):
        assert got.dtype == ref.dtype == x_dtype
        diff = (got.float() - ref.float()).abs()
        assert torch.equal(got, ref), f"{int((diff > 0).sum())} of {diff.numel()} differ, max {diff.max().item():.3g}"
    else:
        assert got == ref  # the same exception as the unpatched module
    assert isinstance(same, torch.Tensor) and h.calls == {"layernorm": 1}  # only the unmixed call ran the kernel


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_under_autocast_the_norms_are_torchs(kind: str) -> None:
    # CUDA autocast runs layer_norm in float32 and returns float32 for a bfloat16 input; the kernel returns
    # bfloat16. Whatever autocast does on a device, the patched model must do: the module's own code runs.
    ln = (nn.LayerNorm(HIDDEN) if kind == "layernorm" else nn.RMSNorm(HIDDEN)).to(torch.bfloat16)
    x = torch.randn(7, HIDDEN, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)  # (7, 96)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = ln(x)
        with optwin.kernels.patch(ln) as h:
            got = ln(x)
    assert got.dtype == ref.dtype and torch.equal(got, ref)
    assert h.calls[kind] == 0
    with torch.no_grad(), optwin.kernels.patch(ln) as h:  # without autocast the kernel takes the call
        ln(x)
    assert h.calls[kind] == 1
