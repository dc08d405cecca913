"""The kernels' bfloat16 outputs are float32 results rounded to nearest even, under TRITON_INTERPRET too.

    python -m pytest -q tests/test_kernels_bf16_rounding.py

The interpreter casts fp32 -> bf16 by truncation where the GPU's cvt rounds to nearest: every CPU
output of rmsnorm, softmax, layernorm and rope was <= the exact value in magnitude (an RMSNorm's output
RMS read 0.9972 for 0.99997), half their elements one bf16 ulp off, so the CPU tests checked other
numerics than the GPU runs. The kernels compute in float32 whatever the input dtype, so a bf16 input's
output must be, bit for bit, torch's rounding of the same kernel's float32 output for the same values.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

from optwin.kernels.layernorm import layernorm  # noqa: E402
from optwin.kernels.rmsnorm import rmsnorm  # noqa: E402
from optwin.kernels.rope import rope  # noqa: E402
from optwin.kernels.softmax import softmax  # noqa: E402

# whole rows in registers (power of two and not), layernorm's Welford layout (4096 = 4 chunks of 1024),
# and a row past the 65536 a program holds (the chunked norms, softmax_long)
ROWS = [(64, 64), (3, 1000), (3, 4096), (1, 65536 + 512)]


def _same_as_rounded(f, x: torch.Tensor) -> None:
    xb = x.bfloat16()
    yb = f(xb)
    y32 = f(xb.float())  # the same values: the kernel's float32 result, unrounded
    assert yb.dtype == torch.bfloat16
    want = y32.bfloat16()  # torch: round to nearest even
    off = (yb.view(torch.int16) != want.view(torch.int16)).sum().item()
    assert off == 0, f"{off} of {yb.numel()} elements differ from round-to-nearest (truncated?)"


@pytest.mark.parametrize("shape", ROWS, ids=lambda s: "x".join(map(str, s)))
def test_norms_and_softmax_round_to_nearest(shape):
    g = torch.Generator().manual_seed(shape[-1])
    x = torch.randn(*shape, generator=g) * 3
    w = (torch.rand(shape[-1], generator=g) + 0.5).bfloat16()  # bf16 values: exact in both dtypes
    b = torch.randn(shape[-1], generator=g).bfloat16()
    _same_as_rounded(lambda t: rmsnorm(t, w.to(t.dtype), 1e-6, sketch=False)[0], x)
    _same_as_rounded(lambda t: layernorm(t, w.to(t.dtype), b.to(t.dtype), 1e-5, sketch=False)[0], x)
    _same_as_rounded(lambda t: softmax(t, sketch=False)[0], x)


@pytest.mark.parametrize("shape", [(7, 4, 64), (33, 2, 128)], ids=lambda s: "x".join(map(str, s)))
def test_rope_rounds_to_nearest(shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(shape[0])) * 3
    pos = torch.arange(shape[0]) * 37
    _same_as_rounded(lambda t: rope(t, pos, 10000.0, sketch=False)[0], x)
