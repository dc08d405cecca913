"""RMSNorm in Triton, with the input sketch written in the same pass (catalog variant rmsnorm/triton).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.rmsnorm import rmsnorm; \
print(rmsnorm(torch.randn(3, 8), torch.ones(8))[1])"

Numerics (what optwin.twin's rmsnorm/triton models), per row of n = hidden elements:
    h = x.float()                      # exact
    v = tl.sum(h * h) / n              # fp32 products, fp32 reduction tree (tl.sum), fp32 division
    r = rsqrt(v + eps)                 # eps as an fp32 scalar; rsqrt is approximate (rsqrt.approx.f32
                                       # on NVIDIA, ~2 ulp), the interpreter uses 1/sqrt in numpy
    y = (h * r * w.float()).to(dtype)  # fp32 products left to right, one rounding to dtype
Memory: read rows*n (x) + n per program (weight, once per persistent program), write rows*n (y);
with the sketch also write (rows + 1) * 3 floats.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.catalog import CATALOG
from optwin.kernels._common import check_device, finite_partials, launch_settings, programs_for, rows_view
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
    # Persistent: each program loads the weight once and walks rows pid, pid + grid, ...; re-reading
    # the weight per row costs as much L2 traffic as x itself. Each row is still reduced by one
    # program in one tree, so the numerics do not depend on the grid.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # read n (dtype) per program
    if SKETCH:
        if pid == 0:  # weight partials into the last row
            wmax, _, wnonfin = finite_partials(w, mask)
            sw = S_ptr + n_rows * S_COLS
            tl.store(sw + 0, wmax)
            tl.store(sw + 1, wnonfin)
            tl.store(sw + 2, 0.0)
    for r in tl.range(pid, n_rows, tl.num_programs(0)):
        row = tl.cast(r, tl.int64)  # 64-bit offsets for tensors past 2^31 elements
        x = tl.load(X_ptr + row * X_row_stride + cols, mask=mask, other=0.0)  # read n (dtype)
        h = x.to(tl.float32)
        v = tl.sum(h * h, axis=0) / n_cols  # fp32 tree sum, fp32 divide
        rs = tl.math.rsqrt(v + eps)  # approximate rsqrt
        y = h * rs * w  # (h*r)*w in fp32
        tl.store(Y_ptr + row * Y_row_stride + cols, y.to(Y_ptr.dtype.element_ty), mask=mask)  # write n
        if SKETCH:
            absmax, sumsq, nonfin = finite_partials(h, mask)  # registers only: x is already loaded
            s = S_ptr + row * S_COLS
            tl.store(s + 0, absmax)
            tl.store(s + 1, sumsq)
            tl.store(s + 2, nonfin)


def _rmsnorm_launch(
    x2: torch.Tensor, weight: torch.Tensor, y2: torch.Tensor, buf: torch.Tensor | None, eps: float
) -> None:
    """Grid: a persistent program per SM slot (programs_for), each over its share of the rows."""
    n_rows, n = x2.shape
    block, warps = launch_settings(n)
    sketch = buf is not None
    if n_rows == 0 and not sketch:
        return
    _rmsnorm_kernel[(programs_for(n_rows, x2.device),)](
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
