"""The order in which Triton 3.6 adds a tl.sum over a 1-D row, and our norms' launches that fix it.

    python -c "import torch; from optwin.twin.numerics import Numerics; from optwin.twin.triton_reduce import tl_sum; \
print(tl_sum(Numerics(), torch.full((1, 768), 1.1).float().double(), 1024, 4, 4))"

What the compiler makes of `tl.sum(h, axis=0)` over a [BLOCK] tensor in a blocked layout of sizePerThread
`spt`, 32 threads a warp and `warps` warps (element i = ((r * warps + w) * 32 + l) * spt + v), read in the
PTX of triton 3.6's offline sm_90 compile of our kernels (layernorm 8x1024 float32: the device's version):
- each thread adds its own registers in order, one chain: ((x[r0 v0] + x[r0 v1]) + ...) + x[r1 v0] ...
  (`reduceWithinThreads`, acc = combine(acc, cur));
- the warp's butterfly shuffles at offsets 16, 8, 4, 2, 1 (shfl.sync.bfly, acc = acc + other): a halving
  tree over the lanes, lane l with lane l + 16 first;
- lane 0 of each warp through shared memory, then the same butterfly over the warps (offsets warps/2 .. 1).
A tensor smaller than the layout keeps only the threads with distinct data: 16 partials at 4 warps reduce
over 16 lanes of one warp (offsets 8 .. 1).
triton 3.9 (this machine's) adds a thread's registers as a pairwise tree instead ((x0 + x1) + (x2 + x3)):
the twin models the device's 3.6. The in-thread chain is what decides a float32 constant row's mean: c + c + c
rounds where a tree of equal halves never does (H100: the GPU's 1024 rows at 384..2048, RESULTS.md, stop 49).

The layouts, from the TTGIR of that compile (3.6 and 3.9 agree): h = x.to(float32) keeps the load's layout,
spt = min(16 bytes / element size, max(BLOCK / threads, 1)); sum_squares' [BLOCK / 4] partials (each 4
neighbours, one thread's registers) spt = max(spt / 4, 1).
"""

from __future__ import annotations

import torch

from optwin.twin.numerics import TRITON_CHUNK, TRITON_WHOLE_ROW_MAX, Numerics, fma_odd
from optwin.twin.numerics import sum_squares as chunked_sum_squares

F32 = "float32"
WARP = 32
VECTOR_BYTES = 16  # a thread's vector load: 4 float32 or 8 16-bit elements
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

# num_warps of our norms' row-in-registers launches per (op, BLOCK), where it is not launch_warps' rule:
# optwin.kernels._common.TUNED and TUNED_BY_ELEMENT (the twin does not import the kernels; a test checks
# these against launch_config). Keyed (op, BLOCK, element bytes or 0 for any).
TUNED_WARPS: dict[tuple[str, int, int], int] = {
    ("rmsnorm", 8192, 0): 8,
    ("rmsnorm", 16384, 0): 8,
    ("layernorm", 16384, 0): 8,
}


def launch_warps(op: str, block: int, esize: int) -> int:
    """num_warps of op's launch at BLOCK for elements of esize bytes: _common.launch_settings' rule (more
    warps for wider blocks) unless TUNED_WARPS has the launch."""
    tuned = TUNED_WARPS.get((op, block, esize)) or TUNED_WARPS.get((op, block, 0))
    if tuned:
        return tuned
    return 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4


def row_layout(n: int, dtype: str, op: str) -> tuple[int, int, int]:
    """(BLOCK, num_warps, spt) of op's row-in-registers kernel for rows of n in dtype: the block, its warps,
    and the elements a thread holds contiguously in h's layout."""
    block = 1 << max(n - 1, 0).bit_length()
    esize = ELEMENT_BYTES[dtype]
    warps = launch_warps(op, block, esize)
    return block, warps, min(VECTOR_BYTES // esize, max(block // (WARP * warps), 1))


def tl_sum(num: Numerics, x: torch.Tensor, block: int, warps: int, spt: int) -> torch.Tensor:
    """Triton 3.6's tl.sum over the last dim of x (..., n) zero-padded to `block` (a power of two) in a
    blocked layout of `spt` contiguous elements a thread, 32 lanes, `warps` warps: each thread's registers in
    sequence, the lanes' butterfly, the warps' butterfly. Returns (..., 1) float64 holding float32 values.
    Noise "order" draws its own order (Numerics.sum's random permutation and lanes)."""
    n = x.shape[-1]
    if num.noise == "order":
        return num.sum(x, order="blocked", lanes=block, keepdim=True)
    spt = max(1, min(spt, block))
    lanes = min(WARP, block // spt)
    wu = max(1, min(warps, block // (spt * WARP)))  # warps holding distinct data
    reps = block // (spt * lanes * wu)
    x = torch.nn.functional.pad(x, (0, block - n))
    x, add = num.terms(x, F32)
    x = x.reshape(*x.shape[:-1], reps, wu, lanes, spt)  # element ((r wu + w) lanes + l) spt + v
    x = x.movedim(-4, -2).flatten(-2)  # (..., wu, lanes, reps * spt): each thread's registers in order
    s = x[..., 0]
    for i in range(1, x.shape[-1]):
        s = add(s, x[..., i])
    # the lanes', then the warps' butterfly: Numerics' halving tree (lanes and warps are powers of two: no padding)
    s = num._tree(num._tree(s, add), add)
    return s.to(torch.float64).unsqueeze(-1)


def sum_squares(num: Numerics, x: torch.Tensor, block: int, warps: int, spt: int) -> torch.Tensor:
    """optwin.kernels._common.sum_squares over a row held whole: each 4 neighbours folded with FMAs,
    fma(x0, x0, fma(x1, x1, fma(x2, x2, x3*x3))) (one rounding a step), zero-padded to `block`, then tl_sum
    over the block / 4 partials in their layout (spt / 4 a thread); a block under 4: tl.sum(x * x).
    (..., 1) float32 values."""
    n = x.shape[-1]
    if block < 4:
        return tl_sum(num, num.round(x * x, F32), block, warps, spt)
    g = torch.nn.functional.pad(x, (0, block - n)).unflatten(-1, (block // 4, 4))  # (..., block / 4, 4)
    q = num.round(g[..., 3] * g[..., 3], F32)  # a float32 square is exact in float64
    for j in (2, 1, 0):
        q = num.round(fma_odd(g[..., j], g[..., j], q), F32)  # fma: one rounding
    return tl_sum(num, q, block // 4, warps, max(spt // 4, 1))


def row_sum(num: Numerics, x: torch.Tensor, dtype: str, op: str) -> torch.Tensor:
    """op's (a Triton norm's) row sum of x (..., n), (..., 1) float32 values: a row held whole (n <=
    TRITON_WHOLE_ROW_MAX) one tl_sum in the kernel's layout, a longer row each lane's sum over the kernel's
    TRITON_CHUNK pieces in sequence, then a tree."""
    n = x.shape[-1]
    if n <= TRITON_WHOLE_ROW_MAX:
        return tl_sum(num, x, *row_layout(n, dtype, op))
    return num.sum(x, order="blocked", lanes=TRITON_CHUNK, keepdim=True)


def row_sum_squares(num: Numerics, x: torch.Tensor, dtype: str, op: str) -> torch.Tensor:
    """op's row sum of x * x, as row_sum reads rows: held whole, sum_squares (FMA-folded neighbours, one tl_sum);
    longer, numerics.sum_squares (every product rounded, per lane over the chunks, then a tree)."""
    n = x.shape[-1]
    if n <= TRITON_WHOLE_ROW_MAX:
        return sum_squares(num, x, *row_layout(n, dtype, op))
    return chunked_sum_squares(num, x)
