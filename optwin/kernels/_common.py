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

# Under TRITON_INTERPRET=1 (CPU tests) the kernels use one tl.max/tl.sum per partial instead of a
# combined multi-operand tl.reduce: same values (same reduction per partial), numpy-fast.
INTERPRET: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")

# Largest finite float32; |h| <= FMAX is false for NaN and ±inf, so it is the finiteness test.
FMAX: tl.constexpr = tl.constexpr(3.4028234663852886e38)


def programs_for(n_rows: int, device: torch.device) -> int:
    """Grid of a persistent kernel: at most 4 programs per SM (one row each in flight), >= 1."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(n_rows, 4 * sms))


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
def _max_sum_sum(a0, a1, a2, b0, b1, b2):
    return tl.maximum(a0, b0), a1 + b1, a2 + b2


@triton.jit
def finite_lanes(h, mask):
    """Per lane: (|h| if finite else 0, its square, 1.0 if in `mask` and NaN/±inf else 0.0)."""
    ah = tl.abs(h)
    fin = mask & (ah <= FMAX)  # NaN compares false
    a = tl.where(fin, ah, 0.0)
    return a, a * a, tl.where(fin, 0.0, tl.where(mask, 1.0, 0.0))


@triton.jit
def reduce_partials(a, q, nf):
    """(max a, sum q, sum nf) over every axis in ONE reduction tree: one cross-warp exchange for
    the three values instead of three (separate tl.max/tl.sum calls each pay a barrier)."""
    if INTERPRET:  # the interpreter's multi-operand reduce is per-element Python (and rejects axis=None)
        return tl.max(a), tl.sum(q), tl.sum(nf)
    else:
        return tl.reduce((a, q, nf), None, _max_sum_sum)


@triton.jit
def finite_partials(h, mask):
    """(largest finite |h|, sum of finite h*h, count of NaN/±inf) over the lanes in `mask`.

    h is a float32 block of any rank; fp32, one combined tree reduction. Non-finite lanes are
    zeroed before squaring, so one NaN does not erase the row's magnitude.
    """
    a, q, nf = finite_lanes(h, mask)
    return reduce_partials(a, q, nf)
