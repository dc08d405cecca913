"""Triton helpers shared by the kernels: launch settings and the finite-only sketch partials.

    python -c "import optwin.kernels._common as c; print(c.launch_settings(16384))"

Imports triton: only the kernel modules import this one.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from optwin.errors import InputError

# Largest row a single program holds in registers (BLOCK >= n, next power of two).
MAX_BLOCK = 65536

# Largest finite float32; |h| <= FMAX is false for NaN and ±inf, so it is the finiteness test.
FMAX: tl.constexpr = tl.constexpr(3.4028234663852886e38)


def launch_settings(n: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for a row of n elements: one row per program, BLOCK = next_pow2(n).

    Warps grow with the block so each thread holds at most ~16-64 elements (Liger-Kernel's table).
    """
    block = triton.next_power_of_2(max(int(n), 1))
    if block > MAX_BLOCK:
        raise InputError(f"row length {n} exceeds the single-program limit {MAX_BLOCK}")
    warps = 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4
    return block, warps


def check_device(*tensors: torch.Tensor) -> None:
    """Kernels run on CUDA, or on CPU under TRITON_INTERPRET=1 (tests)."""
    for t in tensors:
        if t.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise InputError(f"Triton kernels need CUDA tensors (or TRITON_INTERPRET=1), got a {t.device} tensor")


def rows_view(x: torch.Tensor) -> torch.Tensor:
    """[..., n] -> (rows, n) with a contiguous last dim (a copy only when the last dim is strided)."""
    x2 = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


@triton.jit
def finite_partials(h, mask):
    """(largest finite |h|, sum of finite h*h, count of NaN/±inf) over the lanes in `mask`.

    h is a float32 block of any rank (reduced over all axes); all three are float32 tree reductions. Non-finite lanes are
    zeroed before squaring, so one NaN does not erase the row's magnitude.
    """
    ah = tl.abs(h)
    fin = mask & (ah <= FMAX)  # NaN compares false
    hf = tl.where(fin, h, 0.0)
    absmax = tl.max(tl.where(fin, ah, 0.0))
    sumsq = tl.sum(hf * hf)
    nonfin = tl.sum(tl.where(mask, 1.0, 0.0)) - tl.sum(tl.where(fin, 1.0, 0.0))
    return absmax, sumsq, nonfin
