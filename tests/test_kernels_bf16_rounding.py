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

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from optwin.kernels._common import store_cast  # noqa: E402
from optwin.kernels.layernorm import layernorm  # noqa: E402
from optwin.kernels.rmsnorm import rmsnorm  # noqa: E402
from optwin.kernels.rope import rope  # noqa: E402
from optwin.kernels.softmax import softmax  # noqa: E402

# whole rows in registers (power of two and not), layernorm's Welford layout (4096 = 4 chunks of 1024),
# and a row past the 65536 a program holds (the chunked norms, softmax_long)
ROWS = [(64, 64), (3, 1000), (3, 4096), (1, 65536 + 512)]


@triton.jit
def _cast(X, Y, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + o, store_cast(tl.load(X + o, mask=o < N), Y.dtype.element_ty), mask=o < N)


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


def test_store_cast_is_torchs_rounding_for_every_kind_of_float32() -> None:
    """_common.store_cast itself over float32 bit patterns of every kind: subnormals (the interpreter's own
    cast re-normalised them wrongly: 0x0003048e became bf16 0x0040), carries into the exponent and up to inf,
    signed zeros, infinities, and NaN (kept a NaN)."""
    special = [0x0003048E, 0x00008000, 0x00018000, 0x007FFFFF, 0x00000001, 0x80008001, 0x7F7FFFFF, 0x7F7F8000,
               0x7F7F7FFF, 0xFF7FFFFF, 0x3F808000, 0x3F818000, 0x7F800000, 0xFF800000, 0x80000000, 0, 0x7FC00000,
               0xFFFFFFFF]
    g = torch.Generator().manual_seed(1)
    bits = torch.cat([torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in special], dtype=torch.int64),
                      torch.randint(-(1 << 31), (1 << 31) - 1, (8192,), generator=g),
                      torch.randint(0, 1 << 23, (2048,), generator=g)])  # subnormals
    x = bits.to(torch.int32).view(torch.float32)
    y = torch.empty(x.shape, dtype=torch.bfloat16)
    _cast[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    want = x.to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.isnan(y[nan]).all()
    off = (y.view(torch.int16) != want.view(torch.int16)) & ~nan
    assert int(off.sum()) == 0, [hex(int(b) & 0xFFFFFFFF) for b in bits[off][:5]]
