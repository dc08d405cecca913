"""Softmax rows that no power of two divides (odd lengths: attention scores at odd sequence lengths, GPT-2's
50257-word vocabulary), read and written through the aligned 16-byte vectors that hold them (the kernel's
WINDOW; optwin.kernels.softmax): the row's whole vectors as the kernel's main tensor, its first and last
partial vectors as a small edge piece folded in after the trees.

windowed says which launches take it (layouts WINDOW_LAYOUTS); _window locates a row, _whole and _edges give
its lanes; _merge_edges, _add_edge_sums and _count_edges fold the edges into the row's max and min, its sums s
and t, and the sketch's squares and -inf count. Before (stop 32) such rows were read element by element, an address register each. H200 bf16,
µs without / with the sketch, L2 flushed: 4096x16383 159.2 / 441.9 -> 71.7 / 88.3, 512x50257 124.8 /
1025.5 -> 54.6 / 91.2 (bench/results/softmax_window_*_h200_s33.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.kernels._common import FMAX, INTERPRET, exp_ftz
from optwin.kernels.packed16 import packable
from optwin.kernels.softmax_sketch import _max_min, _sum_pair

# The kernel's layouts that read such rows through their vectors (0: without the sketch); layouts 3 and 8, the
# bench's references, read them element by element.
WINDOW_LAYOUTS = (0, 4, 10)


def windowed(x2: torch.Tensor, y2: torch.Tensor, align: int) -> bool:
    """True where the kernel reads and writes rows through their aligned vectors (WINDOW): rows
    that only 1 divides (ALIGN 1: element loads otherwise) and that words do not take (packed16.packable),
    y's rows at x's offsets (same row stride) and both 16-byte aligned. The launches with and without the
    sketch (layouts 4 and 10) see the same rule, so the same lanes and tree (y the same)."""
    return (align == 1 and not packable(x2) and x2.stride(0) == y2.stride(0) and x2.data_ptr() % 16 == 0
            and y2.data_ptr() % 16 == 0)


@triton.jit
def _window(row, X_row_stride, n_cols, VEC: tl.constexpr):
    """A row that no power of two divides (WINDOW), located in its 16-byte vectors. Before (ALIGN 1) such rows
    were read and written element by element, an address register each: H200 bf16 42-66 % of copy, the
    sketch +50 to +210 % (bench/results/softmax_odd_*_h200_s32.md). Returns (start, off, first, end): the
    row's first element lies at start + off, start a multiple of VEC (a 16-byte vector), 0 <= off < VEC;
    vectors first .. end - 1 from start lie wholly in the row (_whole), the first one (where off > 0) and
    vector `end` hold its edges (_edges). The row's lanes are off .. off + n - 1, which BLOCK = next_pow2(n)
    holds but for the last partial vector. The sums add the edges' after the interior's tree, so y's last
    bits depend on where a row lies."""
    at = row * X_row_stride
    start = at // VEC * VEC  # the product shows the alignment analysis that VEC divides it
    off = (at - start).to(tl.int32)
    return start, off, (off + VEC - 1) // VEC, (off + n_cols) // VEC


@triton.jit
def _whole(first, end, LANES: tl.constexpr, PER_VEC: tl.constexpr):
    """[LANES] mask of the lanes in vectors first .. end - 1 (_window), PER_VEC lanes a vector: VEC elements,
    or VEC // 2 words of two 16-bit elements (layout 10: every word of a whole vector is the row's). Read and
    written whole; -inf elsewhere."""
    vec = tl.arange(0, LANES) // PER_VEC  # constant over each vector's lanes: whole-vector loads and stores
    return (vec >= first) & (vec < end)


@triton.jit
def _edges(off, first, end, n_cols, VEC: tl.constexpr):
    """(pos, edge) [2 * VEC]: the lanes of the row's first vector (where off > 0) and of vector `end` (its last
    partial one), as positions from start, and which of them are the row's. Read and written element by
    element (their other elements are the neighbour rows'), folded into the row's max, sums and sketch after
    the trees."""
    k = tl.arange(0, 2 * VEC)
    pos = tl.where(k < VEC, k, end * VEC + k - VEC)
    # the first vector only where off > 0 (else it is whole, or it is vector `end`); vector `end` only past
    # the first one (n + off < VEC: one vector, the first)
    edge = (pos >= off) & (pos < off + n_cols) & (tl.where(k < VEC, off, end - first + 1) > 0)  # tensor compares
    return pos, edge


@triton.jit
def _merge_edges(m, rmin, he):
    """A WINDOW row's (max, min over non-(-inf) entries) from its interior's and its edges he (-inf off
    the row), the edges' two in one tree."""
    lo = tl.where(he == -float("inf"), float("inf"), he)
    if INTERPRET:
        m_e, rmin_e = tl.max(he, 0), tl.min(lo, 0)
    else:
        m_e, rmin_e = tl.reduce((he, lo), 0, _max_min)
    return tl.maximum(m, m_e), tl.minimum(rmin, rmin_e)


@triton.jit
def _add_edge_sums(s, t, he, m):
    """A WINDOW row's (edge e, s, t): the interior's sums s and t plus its edges' (e = exp(h - m), the same e
    with and without the sketch; t's lanes clamped as _exp_sums_clamped's: -inf lanes add 0 * -FMAX)."""
    d = he - m
    e = exp_ftz(d)
    s_e, t_e = _sum_pair(e, e * tl.maximum(d, -FMAX))
    return e, s + s_e, t + t_e


@triton.jit
def _count_edges(e_sq, e_num, he, edge):
    """A program's edge-lane accumulators (reduced once, after its rows) with a WINDOW row's edges added:
    squares over non-(-inf) lanes in float64 (an HF mask's 3.4e38 squares to 1.2e77; NaN or +inf stays
    non-finite and sends the program to the exact pass), and the row's non-(-inf) edge lanes, which the
    interior's -inf count took for padding."""
    hz = tl.where(he == -float("inf"), 0.0, he).to(tl.float64)
    return e_sq + hz * hz, e_num + (edge & (he != -float("inf"))).to(tl.int32)
