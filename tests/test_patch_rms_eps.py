"""torch.nn.RMSNorm(eps=None) patched in half precision: the epsilon is float32's, as torch's own.

    python -m pytest -q tests/test_patch_rms_eps.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import optwin.kernels  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_torch_rms_norm_with_the_default_eps_matches_torch(dtype):
    """torch computes fp16/bf16 rms_norm in float32 and, with eps=None, adds float32's epsilon: taking the input
    dtype's (bf16: 2**-7) instead swamps the mean square of embedding-scale activations (0.02 ** 2 = 4e-4)."""
    norm = nn.RMSNorm(64).to(dtype)
    x = (torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 0.02).to(dtype)  # (4, 64)
    with torch.no_grad():
        ref = norm(x)
        with optwin.kernels.patch(norm) as h:
            got = norm(x)
    assert h.calls == {"rmsnorm": 1}
    err = (got.float() - ref.float()).abs().max().item()
    assert err < 2e-2, f"patched RMSNorm differs from torch's by {err}"  # a couple of bf16 ulps at |y| ~ 2
