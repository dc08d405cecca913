"""Two 16-bit floats (bf16 or fp16) per 32-bit word: the row kernels' reads of 16-bit inputs.

Why: a float32 lane per element pays for everything the hardware can do on element pairs. On
sm_80+ a word holds two elements and one instruction compares (HSET2), takes the max or min
(HMNMX2), or masks (LOP3) both of them. A bf16 pair also converts to float32 in one instruction
per element (a shift for the low half, an AND for the high half), where `x.to(tl.float32)` took a
PRMT and a SHF for the high half. The max and min of bf16 or fp16 values are bf16 or fp16 values,
so taking them on the pairs is exact; only sums need float32.

Word layout (little-endian): element 2k is the low half of word k, element 2k + 1 the high half.
`unpack` returns the [HALF] float32 lows and highs; `join_pairs` makes the [2 * HALF] row in
element order. The interpreter has no inline PTX: it runs the same operations through integer and
float32 ops on the halves.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.kernels._common import INTERPRET

# A word of two -inf halves, as a signed int32 (loads of padding words; the -inf test's operand).
NEG_INF_PAIR = {torch.bfloat16: -8323200, torch.float16: -67044352}  # 0xFF80FF80, 0xFC00FC00
assert all(v == int.from_bytes(b, "little", signed=True) for v, b in zip(
    NEG_INF_PAIR.values(), (bytes.fromhex("80ff80ff"), bytes.fromhex("00fc00fc"))))
SIGN_PAIR: tl.constexpr = tl.constexpr(-2147450880)  # 0x80008000: the two sign bits
LOW_BITS_PAIR: tl.constexpr = tl.constexpr(0x00010001)  # bit 0 of each half: 1 per half of a 0xFFFF-per-half mask
HIGH_HALF: tl.constexpr = tl.constexpr(-65536)  # 0xFFFF0000
# bf16's lowest finite value, torch.finfo(torch.bfloat16).min: HF's attention masks add it to masked scores.
LOWEST_BF16: tl.constexpr = tl.constexpr(-3.3895313892515355e38)  # 0xFF7F


def packable(x2: torch.Tensor) -> bool:
    """True if rows of x2 (rows, n) can be read as words: a 16-bit float dtype, n and the row stride
    even, the data 4-byte aligned (a view at an odd offset is not)."""
    return (x2.dtype in NEG_INF_PAIR and x2.shape[-1] % 2 == 0 and (x2.stride(0) % 2 == 0 or x2.shape[0] <= 1)
            and x2.data_ptr() % 4 == 0)


@triton.jit
def _half_lo(w, BF16: tl.constexpr):
    """Low halves of words w as float32."""
    if BF16:
        return (w << 16).to(tl.float32, bitcast=True)
    else:
        return (w & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _half_hi(w, BF16: tl.constexpr):
    """High halves of words w as float32 (bf16: one AND; the sign-extending shift is not needed)."""
    if BF16:
        return (w & HIGH_HALF).to(tl.float32, bitcast=True)
    else:
        return (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def unpack(w, BF16: tl.constexpr):
    """(lows, highs) of words w as float32: elements 2k and 2k + 1."""
    return _half_lo(w, BF16), _half_hi(w, BF16)


@triton.jit
def join_pairs(lo, hi, HALF: tl.constexpr):
    """[HALF] lows and highs -> the [2 * HALF] row in element order (each pair stays in one thread)."""
    return tl.reshape(tl.join(lo, hi), [2 * HALF])


@triton.jit
def neg_inf_mask(w, BF16: tl.constexpr):
    """0xFFFF in each half of w that is -inf, 0 elsewhere (one set.eq.u32 on the pair)."""
    if INTERPRET:
        lo, hi = unpack(w, BF16)
        return tl.where(lo == -float("inf"), 0xFFFF, 0) | tl.where(hi == -float("inf"), HIGH_HALF, 0)
    else:
        if BF16:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 c; mov.b32 c, 0xFF80FF80; set.eq.u32.bf16x2 $0, $1, c; }", "=r,r", [w],
                dtype=tl.int32, is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 c; mov.b32 c, 0xFC00FC00; set.eq.u32.f16x2 $0, $1, c; }", "=r,r", [w],
                dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def lowest_mask(w):
    """0xFFFF in each bf16 half of w that is the lowest finite value (0xFF7F), 0 elsewhere (one
    set.eq.u32 on the pair)."""
    if INTERPRET:
        lo, hi = unpack(w, True)
        return tl.where(lo == LOWEST_BF16, 0xFFFF, 0) | tl.where(hi == LOWEST_BF16, HIGH_HALF, 0)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 c; mov.b32 c, 0xFF7FFF7F; set.eq.u32.bf16x2 $0, $1, c; }", "=r,r", [w],
            dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _pair_max_min(a0, a1, b0, b1, BF16: tl.constexpr):
    """(half-wise max of words a0 and b0, half-wise min of a1 and b1): max/min.bf16x2 or .f16x2, whose
    NaN half yields the other. GPU only: the interpreter takes row_max_min over the float32 halves.
    The PTX is chosen by an if on BF16, not indexed from a constexpr tuple: the H200's triton 3.6 did
    not compile that form (stop 21)."""
    if BF16:
        return tl.inline_asm_elementwise("max.bf16x2 $0, $2, $4; min.bf16x2 $1, $3, $5;", "=r,=r,r,r,r,r",
                                         [a0, a1, b0, b1], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise("max.f16x2 $0, $2, $4; min.f16x2 $1, $3, $5;", "=r,=r,r,r,r,r",
                                         [a0, a1, b0, b1], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def _max_min_bf16(a0, a1, b0, b1):
    return _pair_max_min(a0, a1, b0, b1, True)


@triton.jit
def _max_min_f16(a0, a1, b0, b1):
    return _pair_max_min(a0, a1, b0, b1, False)


@triton.jit
def row_max_min(w, wl, BF16: tl.constexpr):
    """(max over words w, min over words wl) of a row, as float32, in one tree on pairs (the
    interpreter, which has no tuple reduce: over the float32 halves, the same values)."""
    if INTERPRET:
        m_lo, m_hi = unpack(w, BF16)
        n_lo, n_hi = unpack(wl, BF16)
        return tl.maximum(tl.max(m_lo, 0), tl.max(m_hi, 0)), tl.minimum(tl.min(n_lo, 0), tl.min(n_hi, 0))
    if BF16:
        wm, wn = tl.reduce((w, wl), 0, _max_min_bf16)
    else:
        wm, wn = tl.reduce((w, wl), 0, _max_min_f16)
    m_lo, m_hi = unpack(wm, BF16)
    n_lo, n_hi = unpack(wn, BF16)
    return tl.maximum(m_lo, m_hi), tl.minimum(n_lo, n_hi)


@triton.jit
def abs_max_pairs(a, b):
    """max(|a|, |b|) of two 16-bit float tensors of one shape, two elements an instruction
    (max.xorsign.abs.bf16x2 / .f16x2 on the element pairs a thread holds: pack=2), in their dtype.
    Exact in magnitude; the sign is garbage (take |.| of the final value). A NaN loses to a number:
    callers that must see NaN count it elsewhere (their sums of squares turn non-finite)."""
    if INTERPRET:
        return tl.maximum(tl.abs(a.to(tl.float32)), tl.abs(b.to(tl.float32))).to(a.dtype)
    elif a.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise("max.xorsign.abs.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.bfloat16,
                                         is_pure=True, pack=2)
    else:
        return tl.inline_asm_elementwise("max.xorsign.abs.f16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float16,
                                         is_pure=True, pack=2)
