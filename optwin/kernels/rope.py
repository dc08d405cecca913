"""Rotary position embedding in Triton, with the input sketch in the same pass (rope/triton).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.rope import rope; \
print(rope(torch.randn(3, 2, 8), torch.arange(3))[0].shape)"

One program per sequence position (all heads at once, so cos/sin are computed once per position
and reused over heads); a tile is (heads, d/2) for each half of the head dim.

Numerics (what optwin.twin's rope/triton models), at position p, frequency j < d/2:
    inv[j] = 1 / base ** (2j / d)       # host, float32, exactly the spec's table (optwin.kernels.production)
    ang = float32(p) * inv[j]           # one fp32 product (p exact below 2^24)
    c, s = cos(ang), sin(ang)           # fp32 tl.cos / tl.sin (libdevice-class accuracy on NVIDIA per the
                                        # bench's large-position check; numpy in the interpreter)
    y1 = x1 * c - x2 * s                # = x*cos + rotate_half(x)*sin on the first half, fp32
    y2 = x2 * c + x1 * s                # second half, fp32; Triton may contract one product into an FMA
    y = cat(y1, y2).to(dtype)           # one rounding
Table mode (HF models: cos/sin given in dtype, [batch, seq, d]) loads both halves of cos/sin instead
of computing them, same combine. Memory: read seq*heads*d (x) + seq positions, write seq*heads*d;
with the sketch also write seq * 4 floats.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.catalog import CATALOG
from optwin.errors import InputError
from optwin.kernels._common import MAX_BLOCK, check_device, finite_lanes, reduce_partials
from optwin.kernels.production import rope_inv_freq
from optwin.kernels.sketch_buffer import LAYOUTS, n_cols, new_buffer

BASE = float(CATALOG["rope"].params["base"])
S_COLS = n_cols("rope")
assert LAYOUTS["rope"][0] == ("absmax", "sumsq", "nonfinite", "abspos")

_INV_CACHE: dict[tuple[int, float, str], torch.Tensor] = {}


@triton.jit
def _rope_kernel(
    X_ptr,  # x (batch, seq, heads, d) through strides, in dtype; d contiguous
    X_batch_stride,
    X_seq_stride,
    X_head_stride,
    Y_ptr,  # y, same layout contract as x, in dtype
    Y_batch_stride,
    Y_seq_stride,
    Y_head_stride,
    P_ptr,  # positions (batch, seq) int64, seq contiguous (angle mode)
    P_batch_stride,
    INV_ptr,  # inverse frequencies (d/2,) float32 (angle mode)
    C_ptr,  # cos table (batch, seq, d) in dtype (table mode)
    SN_ptr,  # sin table, same layout as cos (table mode)
    C_batch_stride,
    C_seq_stride,
    S_ptr,  # sketch partials, float32 (batch * seq, S_COLS); unused unless SKETCH
    n_seq,
    n_heads,
    half,  # d / 2
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,  # >= half
    FROM_TABLES: tl.constexpr,
    SKETCH: tl.constexpr,
    S_COLS: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // n_seq
    s = pid % n_seq
    hs = tl.arange(0, BLOCK_H)[:, None]  # (BLOCK_H, 1)
    js = tl.arange(0, BLOCK_D)[None, :]  # (1, BLOCK_D)
    mask = (hs < n_heads) & (js < half)  # (BLOCK_H, BLOCK_D)
    xp = X_ptr + b * X_batch_stride + s * X_seq_stride + hs * X_head_stride + js
    x1 = tl.load(xp, mask=mask, other=0.0).to(tl.float32)  # read heads*d/2 (dtype)
    x2 = tl.load(xp + half, mask=mask, other=0.0).to(tl.float32)  # read heads*d/2 (dtype)
    if FROM_TABLES:
        cp = b * C_batch_stride + s * C_seq_stride + js  # (1, BLOCK_D)
        jm = js < half
        c1 = tl.load(C_ptr + cp, mask=jm, other=0.0).to(tl.float32)  # read d (dtype), per position
        c2 = tl.load(C_ptr + cp + half, mask=jm, other=0.0).to(tl.float32)
        s1 = tl.load(SN_ptr + cp, mask=jm, other=0.0).to(tl.float32)
        s2 = tl.load(SN_ptr + cp + half, mask=jm, other=0.0).to(tl.float32)
        pos = 0.0
    else:
        pos_i = tl.load(P_ptr + b * P_batch_stride + s)  # read 1 int64
        pos = pos_i.to(tl.float32)
        inv = tl.load(INV_ptr + js, mask=js < half, other=0.0)  # read d/2 fp32 (L1/L2 hits)
        ang = pos * inv  # (1, BLOCK_D) fp32
        c1 = tl.cos(ang)
        s1 = tl.sin(ang)
        c2 = c1
        s2 = s1
    y1 = x1 * c1 - x2 * s1
    y2 = x2 * c2 + x1 * s2
    yp = Y_ptr + b * Y_batch_stride + s * Y_seq_stride + hs * Y_head_stride + js
    tl.store(yp, y1.to(Y_ptr.dtype.element_ty), mask=mask)  # write heads*d/2
    tl.store(yp + half, y2.to(Y_ptr.dtype.element_ty), mask=mask)  # write heads*d/2
    if SKETCH:
        a1, q1, n1 = finite_lanes(x1, mask)
        a2, q2, n2 = finite_lanes(x2, mask)
        amax, sumsq, nonfin = reduce_partials(tl.maximum(a1, a2), q1 + q2, n1 + n2)  # one tree
        st = S_ptr + pid * S_COLS
        tl.store(st + 0, amax)
        tl.store(st + 1, sumsq)
        tl.store(st + 2, nonfin)
        tl.store(st + 3, tl.abs(pos))  # 0 in table mode: positions unknown


def _inv_freq(d: int, base: float, device: torch.device) -> torch.Tensor:
    """The spec's float32 inverse-frequency table, computed once per (d, base, device)."""
    key = (d, base, str(device))
    if key not in _INV_CACHE:
        _INV_CACHE[key] = rope_inv_freq(d, base, device)
    return _INV_CACHE[key]


def _check_4d(x: torch.Tensor) -> None:
    if x.ndim != 4 or x.shape[-1] % 2 or x.stride(-1) != 1:
        raise InputError(f"rope: x must be (batch, seq, heads, d) with even, contiguous d; got {tuple(x.shape)}")
    if triton.next_power_of_2(x.shape[2]) * triton.next_power_of_2(x.shape[3]) > MAX_BLOCK:
        raise InputError(f"rope: heads*d = {x.shape[2] * x.shape[3]} exceeds the single-program limit {MAX_BLOCK}")


def _rope_launch(
    x4: torch.Tensor,  # (batch, seq, heads, d) view
    y4: torch.Tensor,  # (batch, seq, heads, d) view
    buf: torch.Tensor | None,
    positions: torch.Tensor | None = None,  # (batch, seq) int64, angle mode
    inv: torch.Tensor | None = None,  # (d/2,) fp32, angle mode
    cos: torch.Tensor | None = None,  # (batch, seq, d), table mode
    sin: torch.Tensor | None = None,
) -> None:
    """Grid: one program per (batch, seq) position."""
    _check_4d(x4)
    batch, seq, heads, d = x4.shape
    if batch * seq == 0:
        return
    tables = cos is not None
    block_h, block_d = triton.next_power_of_2(heads), triton.next_power_of_2(d // 2)
    tile = block_h * block_d * 2
    warps = 16 if tile >= 8192 else 8 if tile >= 2048 else 4
    sketch = buf is not None
    dummy = y4
    _rope_kernel[(batch * seq,)](
        x4, x4.stride(0), x4.stride(1), x4.stride(2),
        y4, y4.stride(0), y4.stride(1), y4.stride(2),
        dummy if tables else positions, 0 if tables else positions.stride(0),
        dummy if tables else inv,
        cos if tables else dummy, sin if tables else dummy,
        cos.stride(0) if tables else 0, cos.stride(1) if tables else 0,
        buf if sketch else dummy,
        seq, heads, d // 2,
        BLOCK_H=block_h, BLOCK_D=block_d, FROM_TABLES=tables, SKETCH=sketch, S_COLS=S_COLS, num_warps=warps,
    )


def rope(
    x: torch.Tensor, positions: torch.Tensor, base: float = BASE, sketch: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(x rotated by positions, sketch buffer or None) for x (seq, heads, d), positions (seq,) ints.

    Read the buffer with optwin.kernels.read_sketch("rope", buf, x.shape, {"base": base}).
    """
    check_device(x, positions)
    if x.ndim != 3 or positions.shape != x.shape[:1]:
        raise InputError(f"rope: x must be (seq, heads, d) and positions (seq,); got {tuple(x.shape)}, {tuple(positions.shape)}")
    x4 = x.unsqueeze(0)  # (1, seq, heads, d)
    if x4.stride(-1) != 1:
        x4 = x4.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # (seq, heads, d)
    buf = new_buffer("rope", x.shape[0], x.device) if sketch else None
    pos = positions.to(torch.int64).contiguous().unsqueeze(0)  # (1, seq)
    _rope_launch(x4, y.unsqueeze(0), buf, positions=pos, inv=_inv_freq(x.shape[-1], float(base), x.device))
    return y, buf


def rope_from_tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """y = x*cos + rotate_half(x)*sin for HF layouts: x (batch, heads, seq, d), cos/sin (batch|1, seq, d).

    fp32 inside, one rounding to x's dtype (HF eager rounds each product to dtype). No sketch.
    """
    check_device(x, cos, sin)
    x4 = x.transpose(1, 2)  # (batch, seq, heads, d) view, no copy
    if x4.stride(-1) != 1:
        x4 = x4.contiguous()
    y = torch.empty_like(x, memory_format=torch.contiguous_format)  # (batch, heads, seq, d)
    cos = cos.expand(x.shape[0], -1, -1) if cos.shape[0] == 1 else cos  # stride 0 over batch
    sin = sin.expand(x.shape[0], -1, -1) if sin.shape[0] == 1 else sin
    if cos.stride(-1) != 1 or cos.stride() != sin.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    _rope_launch(x4, y.transpose(1, 2), None, cos=cos, sin=sin)
    return y
