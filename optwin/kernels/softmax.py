"""Softmax over the last dim in Triton, with the input sketch in the same pass (softmax/triton).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.softmax import softmax; \
print(softmax(torch.randn(2, 5))[0])"

Numerics (what optwin.twin's softmax/triton models), per row of n elements:
    h = x.float()               # exact; -inf marks masked positions
    m = tl.max(h)               # exact
    e = exp(h - m)              # fp32 subtraction; tl.exp is approximate, like __expf
                                # (ex2.approx.f32 of (h-m)*log2(e) on NVIDIA); numpy exp in the interpreter
    s = tl.sum(e)               # fp32 reduction tree
    y = (e / s).to(out dtype)   # fp32 division (div.full.f32 on NVIDIA, ~2 ulp), one rounding
A fully masked row gives m = -inf, h - m = NaN: y is NaN, as torch.softmax gives.
Memory: read rows*n (x), write rows*n (y, in x's dtype or the requested out dtype); with the sketch
also write rows * 6 floats.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.kernels._common import FMAX, INTERPRET, check_device, launch_settings, rows_view
from optwin.kernels.sketch_buffer import LAYOUTS, n_cols, new_buffer

S_COLS = n_cols("softmax")
assert LAYOUTS["softmax"][0] == ("absmax", "sumsq", "nonfinite", "max", "min", "neginf")


@triton.jit
def _combine6(a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5):
    return tl.maximum(a0, b0), a1 + b1, a2 + b2, tl.maximum(a3, b3), tl.minimum(a4, b4), a5 + b5


@triton.jit
def _softmax_kernel(
    X_ptr,  # x as (n_rows, n_cols) in dtype, last dim contiguous
    X_row_stride,
    Y_ptr,  # y as (n_rows, n_cols) in the output dtype, contiguous
    Y_row_stride,
    S_ptr,  # sketch partials, float32 (n_rows, S_COLS); unused unless SKETCH
    n_cols,
    BLOCK: tl.constexpr,
    SKETCH: tl.constexpr,
    S_COLS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X_ptr + row * X_row_stride + cols, mask=mask, other=-float("inf"))  # read n (dtype)
    h = x.to(tl.float32)
    m = tl.max(h, axis=0)
    e = tl.exp(h - m)  # approximate exp; padding lanes give exp(-inf) = 0
    s = tl.sum(e, axis=0)  # fp32 tree sum
    y = e / s
    tl.store(Y_ptr + row * Y_row_stride + cols, y.to(Y_ptr.dtype.element_ty), mask=mask)  # write n
    if SKETCH:
        # Registers only, one combined reduction tree for the six partials. -inf is a mask (counted
        # apart); NaN and +inf are non-finite.
        ah = tl.abs(h)
        fin = mask & (ah <= FMAX)
        a = tl.where(fin, ah, 0.0)
        nf = tl.where(fin | (h < -FMAX), 0.0, tl.where(mask, 1.0, 0.0))  # NaN, +inf
        neg = tl.where(mask & (h < -FMAX), 1.0, 0.0)  # exactly the -inf lanes (NaN compares false)
        hi = tl.where(fin, h, -float("inf"))
        lo = tl.where(fin, h, float("inf"))
        if INTERPRET:
            amax, sumsq, nonfin = tl.max(a, 0), tl.sum(a * a, 0), tl.sum(nf, 0)
            rmax, rmin, nneg = tl.max(hi, 0), tl.min(lo, 0), tl.sum(neg, 0)
        else:
            amax, sumsq, nonfin, rmax, rmin, nneg = tl.reduce((a, a * a, nf, hi, lo, neg), 0, _combine6)
        st = S_ptr + row * S_COLS
        tl.store(st + 0, amax)
        tl.store(st + 1, sumsq)
        tl.store(st + 2, nonfin)
        tl.store(st + 3, rmax)  # -inf: no finite entry
        tl.store(st + 4, rmin)  # +inf: no finite entry
        tl.store(st + 5, nneg)


def _softmax_launch(x2: torch.Tensor, y2: torch.Tensor, buf: torch.Tensor | None) -> None:
    """Grid: one program per row."""
    n_rows, n = x2.shape
    if n_rows == 0:
        return
    block, warps = launch_settings(n)
    sketch = buf is not None
    _softmax_kernel[(n_rows,)](
        x2, x2.stride(0), y2, y2.stride(0), buf if sketch else y2, n,
        BLOCK=block, SKETCH=sketch, S_COLS=S_COLS, num_warps=warps,
    )


def softmax(
    x: torch.Tensor, sketch: bool = True, out_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(softmax of x over the last dim, sketch buffer or None); y in out_dtype (default x's dtype).

    Read the buffer with optwin.kernels.read_sketch("softmax", buf, x.shape).
    """
    check_device(x)
    x2 = rows_view(x)  # (rows, n)
    y2 = torch.empty(x2.shape, dtype=out_dtype or x.dtype, device=x.device)  # (rows, n)
    buf = new_buffer("softmax", x2.shape[0], x.device) if sketch else None
    _softmax_launch(x2, y2, buf)
    return y2.reshape(x.shape), buf
