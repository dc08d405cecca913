"""RMSNorm in Triton, with the input sketch written in the same pass (catalog variant rmsnorm/triton).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.rmsnorm import rmsnorm; \
print(rmsnorm(torch.randn(3, 8), torch.ones(8))[1])"

Numerics (what optwin.twin's rmsnorm/triton models), per row of n = hidden elements:
    h = x.float()                      # exact
    v = tl.sum(h * h) / n              # fp32 products, fp32 reduction tree (tl.sum), fp32 division
    r = rsqrt(v + eps)                 # eps as an fp32 scalar; rsqrt is approximate (rsqrt.approx.f32
                                       # on NVIDIA, ~2 ulp), the interpreter uses 1/sqrt in numpy
    y = (h * r * w.float()).to(dtype)  # fp32 products left to right, one rounding to dtype
Memory: read rows*n (x) + n per program (weight, L2-resident), write rows*n (y); with the sketch
also write (rows + 1) * 3 floats.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.catalog import CATALOG
from optwin.kernels._common import check_device, finite_partials, launch_settings, rows_view
from optwin.kernels.sketch_buffer import LAYOUTS, n_cols, new_buffer

EPS = CATALOG["rmsnorm"].constants["eps"]
S_COLS = n_cols("rmsnorm")
assert LAYOUTS["rmsnorm"] == (("absmax", "sumsq", "nonfinite"), ("weight_absmax", "weight_nonfinite"))


@triton.jit
def _rmsnorm_kernel(
    X_ptr,  # x as (n_rows, n_cols) in dtype, last dim contiguous
    X_row_stride,
    W_ptr,  # weight (n_cols,) in dtype
    Y_ptr,  # y as (n_rows, n_cols) in dtype, contiguous
    Y_row_stride,
    S_ptr,  # sketch partials, float32 (n_rows + 1, S_COLS); unused unless SKETCH
    n_rows,
    n_cols,
    eps,  # fp32 scalar
    BLOCK: tl.constexpr,
    SKETCH: tl.constexpr,
    S_COLS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if row < n_rows:
        x = tl.load(X_ptr + row * X_row_stride + cols, mask=mask, other=0.0)  # read n (dtype)
        w = tl.load(W_ptr + cols, mask=mask, other=0.0)  # read n (dtype), shared by all rows: L2 hits
        h = x.to(tl.float32)
        v = tl.sum(h * h, axis=0) / n_cols  # fp32 tree sum, fp32 divide
        r = tl.math.rsqrt(v + eps)  # approximate rsqrt
        y = h * r * w.to(tl.float32)  # (h*r)*w in fp32
        tl.store(Y_ptr + row * Y_row_stride + cols, y.to(Y_ptr.dtype.element_ty), mask=mask)  # write n
        if SKETCH:
            absmax, sumsq, nonfin = finite_partials(h, mask)  # registers only: x is already loaded
            s = S_ptr + row * S_COLS
            tl.store(s + 0, absmax)
            tl.store(s + 1, sumsq)
            tl.store(s + 2, nonfin)
    else:
        if SKETCH:  # the one extra program, launched only with SKETCH: weight partials, last row
            w = tl.load(W_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            wmax, _, wnonfin = finite_partials(w, mask)
            s = S_ptr + n_rows * S_COLS
            tl.store(s + 0, wmax)
            tl.store(s + 1, wnonfin)
            tl.store(s + 2, 0.0)


def _rmsnorm_launch(
    x2: torch.Tensor, weight: torch.Tensor, y2: torch.Tensor, buf: torch.Tensor | None, eps: float
) -> None:
    """Grid: one program per row (+1 for the weight partials when sketching)."""
    n_rows, n = x2.shape
    block, warps = launch_settings(n)
    sketch = buf is not None
    grid = (n_rows + int(sketch),)
    if grid[0] == 0:
        return
    _rmsnorm_kernel[grid](
        x2, x2.stride(0), weight, y2, y2.stride(0), buf if sketch else y2,
        n_rows, n, eps, BLOCK=block, SKETCH=sketch, S_COLS=S_COLS, num_warps=warps,
    )


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = EPS, sketch: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y, sketch buffer or None): y = x * rsqrt(mean(x^2) + eps) * weight, in x's dtype.

    Read the buffer with optwin.kernels.read_sketch("rmsnorm", buf, x.shape).
    """
    check_device(x, weight)
    x2 = rows_view(x)  # (rows, hidden)
    y2 = torch.empty(x2.shape, dtype=x.dtype, device=x.device)  # (rows, hidden)
    buf = new_buffer("rmsnorm", x2.shape[0], x.device) if sketch else None
    _rmsnorm_launch(x2, weight.contiguous(), y2, buf, float(eps))
    return y2.reshape(x.shape), buf
