"""LayerNorm over the last dim in Triton, with the input sketch in the same pass (layernorm/triton).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.layernorm import layernorm; \
print(layernorm(torch.randn(2, 5), torch.ones(5), torch.zeros(5))[0])"

Numerics (what optwin.twin's layernorm/triton models), per row of n = hidden elements:
    h = x.float()                              # exact
    m = tl.sum(h) / n                          # fp32 reduction tree, fp32 divide
    d = h - m                                  # fp32
    var = tl.sum(d * d) / n                    # two-pass: fp32 tree, fp32 divide (no E[x^2]-m^2 cancellation)
    r = rsqrt(var + eps)                       # eps as fp32 scalar; approximate rsqrt (rsqrt.approx.f32)
    y = (d * r * w.float() + b.float()).to(dtype)   # fp32, left to right (Triton contracts the last mul+add into an FMA on NVIDIA), one rounding
Memory: read rows*n (x) + 2n per persistent program (weight, bias), write rows*n (y); with the
sketch also write (rows + 1) * 5 floats.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.catalog import CATALOG
from optwin.kernels._common import FMAX, check_device, finite_partials, launch_settings, programs_for, rows_view
from optwin.kernels.sketch_buffer import LAYOUTS, n_cols, new_buffer

EPS = CATALOG["layernorm"].constants["eps"]
S_COLS = n_cols("layernorm")
assert LAYOUTS["layernorm"] == (
    ("absmax", "sumsq", "nonfinite", "mean", "std"),
    ("weight_absmax", "bias_absmax", "param_nonfinite"),
)


@triton.jit
def _layernorm_kernel(
    X_ptr,  # x as (n_rows, n_cols) in dtype, last dim contiguous
    X_row_stride,
    W_ptr,  # weight (n_cols,) in dtype
    B_ptr,  # bias (n_cols,) in dtype
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
    # Persistent: weight and bias are loaded once per program, which then walks rows pid, pid + grid,
    # ...; each row is still reduced by one program in one tree (numerics independent of the grid).
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # read n (dtype) per program
    b = tl.load(B_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # read n (dtype) per program
    if SKETCH:
        if pid == 0:  # weight and bias partials into the last row
            wmax, _, wnonfin = finite_partials(w, mask)
            bmax, _, bnonfin = finite_partials(b, mask)
            sw = S_ptr + n_rows * S_COLS
            tl.store(sw + 0, wmax)
            tl.store(sw + 1, bmax)
            tl.store(sw + 2, wnonfin + bnonfin)
            tl.store(sw + 3, 0.0)
            tl.store(sw + 4, 0.0)
    for r in tl.range(pid, n_rows, tl.num_programs(0)):
        row = tl.cast(r, tl.int64)  # 64-bit offsets for tensors past 2^31 elements
        x = tl.load(X_ptr + row * X_row_stride + cols, mask=mask, other=0.0)  # read n (dtype)
        h = x.to(tl.float32)
        m = tl.sum(h, axis=0) / n_cols  # first pass (registers)
        d = tl.where(mask, h - m, 0.0)
        var = tl.sum(d * d, axis=0) / n_cols  # second pass over registers, not memory
        rs = tl.math.rsqrt(var + eps)  # approximate rsqrt
        y = d * rs * w + b
        tl.store(Y_ptr + row * Y_row_stride + cols, y.to(Y_ptr.dtype.element_ty), mask=mask)  # write n
        if SKETCH:
            absmax, sumsq, nonfin = finite_partials(h, mask)
            # mean and population std over the finite entries; equal to (m, var) when all are finite
            mf = m
            vf = var
            if nonfin > 0:  # rare: recompute without the NaN/±inf lanes
                fin = mask & (tl.abs(h) <= FMAX)
                cnt = tl.maximum(n_cols - nonfin, 1.0)
                mf = tl.sum(tl.where(fin, h, 0.0), axis=0) / cnt
                df = tl.where(fin, h - mf, 0.0)
                vf = tl.sum(df * df, axis=0) / cnt
            s = S_ptr + row * S_COLS
            tl.store(s + 0, absmax)
            tl.store(s + 1, sumsq)
            tl.store(s + 2, nonfin)
            tl.store(s + 3, mf)
            tl.store(s + 4, tl.sqrt(vf))


def _layernorm_launch(
    x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, y2: torch.Tensor,
    buf: torch.Tensor | None, eps: float,
) -> None:
    """Grid: a persistent program per SM slot (programs_for), each over its share of the rows."""
    n_rows, n = x2.shape
    block, warps = launch_settings(n)
    sketch = buf is not None
    if n_rows == 0 and not sketch:
        return
    _layernorm_kernel[(programs_for(n_rows, x2.device),)](
        x2, x2.stride(0), weight, bias, y2, y2.stride(0), buf if sketch else y2,
        n_rows, n, eps, BLOCK=block, SKETCH=sketch, S_COLS=S_COLS, num_warps=warps,
    )


def layernorm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = EPS, sketch: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(layer norm of x over the last dim with weight and bias, sketch buffer or None), x's dtype.

    Read the buffer with optwin.kernels.read_sketch("layernorm", buf, x.shape).
    """
    check_device(x, weight, bias)
    x2 = rows_view(x)  # (rows, hidden)
    y2 = torch.empty(x2.shape, dtype=x.dtype, device=x.device)  # (rows, hidden)
    buf = new_buffer("layernorm", x2.shape[0], x.device) if sketch else None
    _layernorm_launch(x2, weight.contiguous(), bias.contiguous(), y2, buf, float(eps))
    return y2.reshape(x.shape), buf
