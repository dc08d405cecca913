"""Softmax over the last dim in Triton, with the input sketch in the same pass (softmax/triton).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.softmax import softmax; \
print(softmax(torch.randn(2, 5))[0])"

Numerics (what optwin.twin's softmax/triton models), per row of n elements:
    h = x.float()               # exact; -inf marks masked positions
    m = tl.max(h)               # exact
    e = exp(h - m)              # fp32 subtraction; approximate exp, like __expf: ex2.approx.ftz.f32 of
                                # (h-m)*log2(e) on NVIDIA (_common.exp_ftz), numpy exp in the interpreter;
                                # results below 2^-126 are 0 (no subnormals) on both
    s = tl.sum(fold8_sum(e))    # fp32 reduction tree, each 8 neighbours (one thread's) summed in order first
    y = (e / s).to(out dtype)   # e * rcp.approx(s) on NVIDIA: the bits of div.full.f32 (~2 ulp) for
                                # s in [1, n] (_common.div_by_row); numpy division in the interpreter
A fully masked row gives m = -inf, h - m = NaN: y is NaN, as torch.softmax gives.
Rows longer than MAX_BLOCK (65536; a vocabulary's logits) go to optwin.kernels.softmax_long: a program
per TRITON_CHUNK-wide piece of a row, s from the pieces' own sums.
exp and the division were tl.exp (non-ftz ex2.approx.f32: a compare and two predicated multiplies
per element for subnormal results) and `e / s` (div.full.f32: two predicated range multiplies per
element) before stop 19: 5 of ~17 SASS instructions per element. H200, 4096x16384 bf16, µs without /
with the sketch: 76.3 / 114.8 -> 73.9 / 109.4; HF-masked scores 76.0 / 123.2 -> 74.5 / 115.4; y equal
bit for bit but where the old y was a subnormal (bench/results/norm_chunks_h200_s19*.md).
Compiled without FMA contraction (enable_fp_fusion=False: nothing in y's path is a mul feeding an
add, so y's numerics are unchanged by it; it keeps the sketch's extra products from being fused
into any shared instruction).
The sketch, 16-bit rows of even length (packed16.packable): layout 10, layout 4 taken on words of two
elements (see PACKED_VARIANT below); its cost at 4096x16384 bf16 on the H200 went from +46 % to +18 %
(L2 flushed; HF-masked scores +56 % -> +30 %); 16-bit rows of odd length from 16 (windowed, below): layout
10 on their whole vectors. Other rows (float32, shorter odd rows, unaligned views): layout VARIANT 4;
layout 8, a select-free branch for rows without -inf, and layout 3, the per-row-tree reference, stay
selectable for bench/softmax_sketch.py and the tests.
statistics that only need a global value are summed per lane: each thread keeps [LANES, KEEP]
fp32 registers across its persistent row loop for the sum of squares (h*h over non-(-inf) lanes,
each 4 neighbours folded with FMAs: _common.lane_sum_squares, 1.25 instead of 2 instructions per
element; H200 115.4 -> 114.6 µs with the sketch, bench/results/norm_chunks_h200_s17d.md)
and the -inf count (padding lanes included and subtracted), reduced across threads once per program
(and every FLUSH rows into float64 / int64, so the fp32 lane sums stay short and the counts exact).
Per-row quantities ride in the op's own trees: the max tree carries (h, min over non-(-inf) lanes)
(max is exact in any tree) and the sum tree carries t = sum e * max(h - m, -FMAX) next to s (s's
lanes and tree are tl.sum's: y is bit-identical with and without the sketch; a lane with e == 0 adds
-0 to t). Per row: max/min/range/min_row_max from (m, row min), masked rows where m = -inf, and the
entropy H = log(s) - t/s, tested as s < exp(low_entropy_nats + t/s) (approximate exp); `peaked_frac`
counts rows below the catalog's low_entropy_nats among rows with s finite (a finite entry and no
NaN/+inf: NaN/+inf and fully masked rows make s NaN). No per-row finiteness test: a NaN/+inf makes
the lane sum of squares non-finite; such a program then re-reads its rows in CHUNK-column pieces for
exact max/min/counts and float64 sums of squares (peaked/eligible stay the loop's, per row). A row
whose finite |h| reaches HUGE (HF's eager attention masks with finfo.min = -3.4e38, whose square
overflows fp32) stays in the loop: one scalar test after the max tree takes back its plain squares
and adds them scaled by 2^-72 to a second lane accumulator; the widest range is kept halved, so 3e38 -
(-3e38) fits float32. H200, 4096x16384 bf16 HF-masked scores with the sketch: 1527 -> 124 µs (the
exact pass before); other inputs +1.5 µs (bench/results/norm_chunks_h200_s16d.md). Layout 10 leaves bf16's
lowest value itself (HF's mask) out of the plain squares and counts it in the rows that hold it
(LOWEST_SQ_SCALED): 4096x16384 HF-masked with the sketch 77.8 -> 76.2 µs, other inputs within the noise
(bench/results/sm_lowest_*_h200_s42.md); deferred, the official bench's +8.2 % -> +5.7 %.
Launch: BLOCK = next_pow2(n); warps and stages from _common.TUNED_BY_ELEMENT (16-bit rows of 2048..32768: 64
elements a thread, at least 2 warps; stop 32, measured: 8 warps at BLOCK 16384, 16 before; BLOCK 65536: 16
warps, 128 elements a thread, stop 34); the sketch
kernel is capped at MAXNREG registers where listed (2 programs per SM). The sketched launch is persistent
except at ROWS_BLOCKS (8192, 16384), where each row has its program, as without the sketch, and writes its
partials as row records that one more program reduces (optwin.kernels.softmax_rows: H200 4096x16384 bf16 with
the sketch 78.0 -> 75.8 µs, 8192x8192 76.9 -> 73.6; stop 35); such a program's lane accumulators ride in its
row's sum tree (_row_sums_lanes: no tree after the row; 75.7 -> 74.4, 8192x8192 73.6 -> 72.8; stop 37). Where
_common.PREFETCH lists the launch (16-bit rows, sm_90+, 16-byte aligned rows), each program first asks the L2
for the row it reads one step later (one cp.async.bulk.prefetch.L2 per row: _common.prefetch_l2), so
DRAM keeps streaming while the warps are in the row's trees: H200 4096x16384 bf16 73.1 / 86.9 ->
70.4 / 81.8 µs without / with the sketch.
Rows that no power of two divides (odd n: attention scores at odd sequence lengths) read and write their
whole 16-byte vectors from the boundary at or before the row's start, and their first and last partial
vectors element by element as two small edge pieces, folded into the row's max, sums and sketch after the
trees (optwin.kernels.softmax_window; stop 33). Before, every element had its own load and store. H200, bf16, µs
without / with the sketch, L2 flushed: 4096x16383 159.2 / 441.9 -> 71.7 / 88.3, 8192x8191 107.6 / 249.6 ->
75.3 / 86.0 (bench/results/softmax_window_*_h200_s33.md). The lanes then start at the row's offset in its
vector, so the sum tree groups other neighbours: y's last bits depend on where a row lies (within an output
ulp of the element-wise order; the twin models tl.sum as a pairwise tree either way).
Memory: read rows*n (x), write rows*n (y, in x's dtype or the requested out dtype); persistent
programs (a program per row without the sketch where _common.ROW_GRID lists the launch, and with it at
ROWS_BLOCKS: two 8-byte record words a row); with the persistent sketch a few scalar
atomics per program and the feature vector.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from optwin.catalog import DEFAULT_TOLERANCES
from optwin.errors import InputError
from optwin.kernels import deferred
from optwin.kernels._common import (
    DTYPES,
    FMAX,
    INTERPRET,
    INTERPRETED,
    MAX_BLOCK,
    RECORD_POLL,
    aligned_rows,
    check_device,
    check_rows,
    column_multiple,
    div_by_row,
    exp_ftz,
    globaltimer,
    grid_per_sm,
    lane_min,
    lane_shape,
    lane_sum,
    lane_sum_squares,
    launch_config,
    next_pow2,
    persistent_grid,
    prefetch_args,
    prefetch_row,
    register_cap,
    rows_view,
    store_cast,
)
from optwin.kernels.launch_plan import Plan, kept, plan, run
from optwin.kernels.packed16 import (
    LOW_BITS_PAIR,
    LOWEST_BF16,
    NEG_INF_PAIR,
    SIGN_PAIR,
    join_pairs,
    lowest_mask,
    neg_inf_mask,
    packable,
    row_max_min,
    unpack,
)
from optwin.kernels.sketch_buffer import (
    WORKSPACE,
    feature_names,
    new_buffer,
    row_records,
    workspace,
)
from optwin.kernels.softmax_long import softmax_long_launch
from optwin.kernels.softmax_rows import _finish_row_records, _store_row_record
from optwin.kernels.softmax_sketch import (
    HUGE,
    HUGE_SCALE,
    HUGE_UNSCALE,
    _exact_row_chunked,
    _max_min,
    _merge_extremes,
    _peaked,
    _row_stats_chunked,
    _sum_pair,
    fresh_partials,
    publish_sketch,
)
from optwin.kernels.softmax_window import (
    WINDOW_LAYOUTS,
    _add_edge_sums,
    _count_edges,
    _edges,
    _merge_edges,
    _whole,
    _window,
    windowed,
)

assert feature_names("softmax") == (
    "numel", "rows", "absmax", "rms", "nonfinite", "n", "max", "min", "max_row_range", "masked_rows", "masked_frac",
    "peaked_frac",
    "min_row_max")
assert [n for n, _ in WORKSPACE["softmax"][0]] == ["sumsq", "max", "min", "max_row_range", "min_row_max"]
assert WORKSPACE["softmax"][1] == ("ticket", "nonfinite", "neginf", "masked_and_peaked_rows", "eligible_rows")

# A row is peaked below this entropy (nats); passed to the kernel as a runtime float.
PEAK_NATS = float(DEFAULT_TOLERANCES.low_entropy_nats)
# Finite |h| at or above this goes to layout 3's slow path: below it a row's fp32 sum of squares
# cannot overflow (2**16 lanes * 2**110 < FMAX), so the main loop's test is lane-wise exact.
BIG: tl.constexpr = tl.constexpr(2.0**55)
# Sketch layouts (VARIANT), timed against each other by bench/softmax_sketch.py on an H200
# (bench/results/softmax_sketch_h200*.md, 4096x16384 bf16, 16 warps, µs without / with the sketch;
# SASS counts from an offline sm_90 compile with triton 3.6, per thread and row of 32 elements):
#   3: the reference layout (the default before the lane accumulators): one max tree carries (h, h*h,
#      min over non-(-inf) lanes, -inf count incl. padding: no column mask in the loop), the sum tree
#      (s, t with lanes e * max(d, -FMAX)); rows with NaN/+inf or a finite |h| >= BIG are re-read
#      after the loop in CHUNK pieces, squares summed in float64. 82.1/121.7 (64 registers: 2
#      programs per SM); 32 warps 81.8/146.4; 8 warps 88.0/142.6; 2 stages 86.3/176.3. ~1095 SASS.
#      With 2 programs per SM the sketch is instruction-bound: ~2x the op's instructions (no sketch
#      539: 17 extra per element, the square, min, -inf count and t lanes and their adds).
#   4: per-lane accumulators: the sum of squares and the -inf count are summed inside each thread
#      into [LANES, KEEP] registers kept across the row loop (reduced across threads once per
#      program; flushed to float64 / int64 every FLUSH rows); the max tree carries (h, min over
#      non-(-inf) lanes), the sum tree (s, t). No per-row finiteness test: NaN/+inf or overflowing
#      squares make the lane sums non-finite and the program re-reads its rows for exact statistics
#      (peaked/eligible stay per row: s is NaN exactly for rows with NaN/+inf or no finite entry).
#      Capped at 64 registers (MAXNREG; uncapped ~100: 1 program per SM, 167.0 µs). ~955 SASS.
#      82.0/116.8 (3: 81.9/120.1 in the same run); second run 82.2/115.8 (3: 82.0/118.9);
#      with FMA fusion 115.4 and 114.7 (kept off: y's bit-identity then rests on the SASS, not on
#      the compile flag)
# The floor of this design is ~8 instructions per element for the sketch (select + square-add for
# the sum of squares, select + add for the -inf count, select + min for the row min, clamp + mul-add
# for t): the -inf masks are what cost, and the timing input masks a column in every row.
# Session 11c (bench/results/softmax_sketch_h200_s11c.md; "masked" = the timing input, "no mask" =
# the same rows without the -inf column):
#   8: branch per row on the max tree's plain row min (max tree (h, min h); padding out of the min by
#      the column mask unless EVEN = BLOCK == n_cols). No -inf: no per-element selects (EVEN): sum of
#      squares h*h, t = sum e*(h - m), no -inf count (NaN/+inf/overflow make the lane sums
#      non-finite: the redo; an h - m overflowing to -inf makes t NaN but also overflows the squares,
#      so the redo recounts eligible/peaked too). Masked rows: layout 4's selects, the min over
#      non-(-inf) lanes per thread then in a second small tree. h - m is inline asm in the masked
#      branch (LLVM hoisted the shared fsub above the branch: h and d live together, 192 bytes of
#      spills). SASS per row (offline sm_90, 64 registers): no mask ~860, masked ~1250 (layout 4
#      ~1010, no sketch 539); 72 bytes of spills. H200: no mask 81.9/99.2 (+21%; layout 4 117.2),
#      masked 82.0/140.1 (+71%; layout 4 116.5); with FMA fusion 99.3 / 126.0. Not the default: slower
#      on the masked input (the masked branch's predicate packing, the extra min tree and spills).
# Measured and dropped (issue #6; the code is in git history before the clean-up):
#   0: as 3 but the exact pass re-read whole rows in the kernel (90 registers: 1 program per SM) and
#      summed squares in fp32 (1e20^2 overflowed rms): 82.0/178.0; 32 warps 81.1/144.2 (pre-#6 default)
#   1: as 3 with t's lanes a compare and select: 82.1/125.0; 32 warps 81.7/144.8 (3 is the same, faster)
#   2: squares and -inf count in the sum tree: 81.5/167.5 (e and h live across it: more registers)
#   5: as 4 with the min and widest row range as lane accumulators too: 82.6/384.3 (spills at 64)
#   6: as 4 with t only for rows that can be peaked (s < exp(peak_nats); lg2 tree): 82.0/118.4,
#      fused 82.1/117.6, slower than 4 (116.8 / 114.7)
#   7: as 4 with the per-row scalars in row slots, LANES rows at a time: never timed on the GPU
#      (~905 SASS but 48 bytes of spills at 64 registers)
#  10: layout 4 on words of two 16-bit elements (stop 21): per word one HSET2 gives the -inf mask
#      (0xFFFF per half), summed as it is into the -inf count (_lane_count_i32; an AND to 1 a half before,
#      through stop 41: H200 bf16 with the sketch 16384x4096 HF-masked 83.4 -> 81.7 µs, no mask 82.7 -> 81.0,
#      4096x16384 within the noise, bench/results/sm_count_*_h200_s42.md), the zeroed word
#      for the squares and the min's word (-inf halves made +inf), and the max and min trees run on
#      pairs (HMNMX2: exact). Across the trees only wd = w - (1 per -inf half) lives: its -inf halves
#      read as the format's lowest finite value, whose e is still 0, so d is finite and t needs no
#      clamp (rows where that fails take the clamped branch: a max at the lowest value, a range past
#      FMAX). t is an FMA chain over each 8 neighbours. Per row and thread of 32 elements (offline
#      sm_90a, main path): 816 -> ~590 SASS. H200, 4096x16384 bf16, µs without / with the sketch
#      (bench/results/norm_chunks_h200_s21d.md, in the same rounds as stop 20's package):
#      masked 73.4 / 86.8 (stop 20: 74.9 / 109.4), HF masks 74.2 / 96.4 (74.2 / 115.4), no mask
#      74.2 / 88.0 (74.3 / 109.5); CUDA graphs 69.5 / 81.5 (69.0 / 102.3).
#      Measured and dropped (norm_chunks_h200_s21b.md, _s21c.md; the code is in git, 77ca289):
#      the squares on the tensor cores (each lane's words as both MMA operands: the diagonal sums
#      squares; 16 HMMA a row instead of ~88 instructions) 98.0 against 89.4 µs, the chained MMAs'
#      latency; unmasked loads where BLOCK == n 89.4 against 86.4 (spills moved into the loop).
VARIANT = 4
PACKED_VARIANT = 10  # the default where x is read as words (packed16.packable)
LAYOUTS = (3, 4, 8, 10)  # the layouts the kernel has (VARIANT's values)
CHUNK = 256  # slow-path piece: no register spill at 16 warps (512 and up: an 8-byte stack frame)
KEEP = 1  # accumulator chains per lane (VARIANT >= 4): [LANES, KEEP] registers each (2 spills at 64)
FLUSH = 16  # rows between float64 flushes of the lane sums of squares (VARIANT >= 4)
# Register cap per (BLOCK, num_warps) of the VARIANT >= 4 sketch kernel (ptxas -maxrregcount): 64
# keeps 2 programs of 16 warps per SM (uncapped it takes ~100 registers: 1 program per SM).
# At BLOCK 8192 (16 warps) the cap is stop 21's: layout 4's kernel with the 8-neighbour folds took more
# than 64 uncapped on the H200's compiler (1 program per SM: 157.8 µs at 8192x8192 bf16 against 112.2
# capped, stop 20's 109.9; layout 10 108.2 capped, 109.3 not; bench/results/norm_chunks_h200_s21f_8192x8192.md).
# Stop 32's 8 warps at BLOCK 16384 are capped at 128 (2 programs per SM). µs with the sketch, same rounds: uncapped
# 78.7, capped at 128 78.0, at 112 77.8 (bench/results/softmax_w8_bf16_h200_s32.md); another run: 128 78.2, 112 77.4,
# 96 79.2, 80 84.8, 168 92.4 (softmax_w8_caps_h200_s32.md). The 16-warp caps stay for the bench's overrides.
# Stop 34: BLOCK 4096 at 2 warps and 8192 at 4 are capped at 128 too. Stop 33's HUGE-branch change (padding
# compared with the -inf count) took their uncapped sketch kernels from 121 to 137 registers (offline sm_90a, triton
# 3.6), 8 -> 7 and 4 -> 3 programs per SM; on the H200, bf16 µs with the sketch, stop 33's start against stop 34's
# (bench/results/softmax_regression_s33_h200_s34.md): 16384x4096 82.3 -> 102.0. Capped at 128: 126 registers, no
# spills, the loop as long (2161 against 2160 SASS). The device time ran out before the capped launch was timed;
# stop 32 timed 8192x8192 at 4 warps capped at 128 against uncapped: 76.9 against 76.2 (softmax_w4_8192_h200_s32.md).
MAXNREG: dict[tuple[int, int], int] = {(16384, 16): 64, (8192, 16): 64, (16384, 8): 128, (4096, 2): 128, (8192, 4): 128}
# The launch without the sketch capped where ptxas' own choice spilled far more: BLOCK 65536 at 16 warps (one
# program per SM, 128 registers a thread to spend). Uncapped, float16 512x50256 compiled to 32 registers and 2372
# bytes of spills (offline sm_90a, triton 3.6), at 128 to 368 bytes; bfloat16 takes 128 either way. Not timed on
# the GPU (found offline after stop 34's last device run).
PLAIN_MAXNREG: dict[tuple[int, int], int] = {(65536, 16): 128}
# BLOCKs whose sketched launch (layout 10: 16-bit rows) runs a program per row, as the launch without the sketch
# does, its partials in row records that one more program reduces (optwin.kernels.softmax_rows; stop 35). H200
# bf16, µs with the sketch (without it), persistent -> a program per row, the same interleaved rounds:
#   4096x16384 78.0 -> 75.8 (70.0); HF-masked 83.2 -> 80.8; CUDA graphs 74.3 -> 72.9; fp16 78.7 -> 75.4;
#   4096x16383 (windowed rows) 87.7 -> 84.4; 16384x12000 241.4 -> 236.5; 8192x8192 76.9 -> 73.6 (72.5), HF-masked
#   77.6 -> 76.1 (bench/results/softmax_rows_*_h200_s35.md).
# Not BLOCK 4096: 16384x4096 81.5 -> 91.4, the finisher falls behind rows that short (as rmsnorm's at 2048).
ROWS_BLOCKS = {8192, 16384}
FUSION = False  # enable_fp_fusion of the VARIANT 3-8 sketch kernels (the sweep's option; layout 10 fuses)
# VARIANT 10: a row whose max exceeds the format's lowest finite value by more than 128 (exp of the
# difference is 0: ex2.approx.ftz underflows below -126 * ln 2) can read its -inf halves as that value.
# In float32 the bf16 bound is the value itself (its ulp is 2^104); fp16's is exact.
POS_SAFE: tl.constexpr = tl.constexpr(2.0**119)  # lowest bf16 - m stays > -FMAX below this m
# bf16 -inf halves read as -2^32 (NEG_MAP_PAIR): rows whose max is above -2^31 (the rest re-read the row and clamp)
NEG_SAFE = {torch.bfloat16: -(2.0**31), torch.float16: float(torch.finfo(torch.float16).min) + 128.0}
NEG_MAP_PAIR: tl.constexpr = tl.constexpr(-813641856)  # 0xCF80CF80: two bf16 -2^32
assert NEG_MAP_PAIR.value == int.from_bytes(bytes.fromhex("80cf80cf"), "little", signed=True)


@triton.jit
def _combine4(a0, a1, a2, a3, b0, b1, b2, b3):
    return tl.maximum(a0, b0), a1 + b1, tl.minimum(a2, b2), a3 + b3


@triton.jit
def _row_sums(e, ed, BLOCK: tl.constexpr):
    """(s, t) = (sum e, sum ed) in one tree over each 8 neighbours' in-order sums: s is the value the
    kernel without the sketch gets from tl.sum(fold8_sum(e))."""
    return _sum_pair(fold8_sum(e, BLOCK), fold8_sum(ed, BLOCK))


@triton.jit
def _exp_sums_clamped(h, m, BLOCK: tl.constexpr):
    """(e = exp(h - m), s = sum e, t = sum e*(h - m)) in one tree; s is the same value tl.sum(e) gives
    (same lanes, same tree, adds only). t's lanes are e * max(d, -FMAX): a lane with e == 0 adds -0,
    -inf lanes give 0 * -FMAX, not NaN (one instruction less per lane than a test of e > 0)."""
    e, fe, fed = _exp_parts_clamped(h, m, BLOCK)
    s, t = _sum_pair(fe, fed)
    return e, s, t


@triton.jit
def _exp_parts_clamped(h, m, BLOCK: tl.constexpr):
    """_exp_sums_clamped before its tree: (e, fold8_sum(e), fold8_sum of t's clamped lanes)."""
    d = h - m
    e = exp_ftz(d)
    return e, fold8_sum(e, BLOCK), fold8_sum(e * tl.maximum(d, -FMAX), BLOCK)


@triton.jit
def _eighths(x, BLOCK: tl.constexpr):
    """[BLOCK] -> the 8 [BLOCK // 8] tensors of elements 8k + j, j = 0..7 (one thread's registers)."""
    a, b = tl.split(tl.reshape(x, [BLOCK // 8, 2, 2, 2]))  # 8k + {0, 2, 4, 6}, 8k + {1, 3, 5, 7}
    a0, a1 = tl.split(a)  # 8k + {0, 4}, 8k + {2, 6}
    b0, b1 = tl.split(b)
    x0, x4 = tl.split(a0)
    x2, x6 = tl.split(a1)
    x1, x5 = tl.split(b0)
    x3, x7 = tl.split(b1)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def fold8_sum(e, BLOCK: tl.constexpr):
    """[BLOCK] -> [BLOCK // 8]: each 8 neighbours summed in order, e0 + e1 + ... + e7 (the first
    level of the row sum's tree, the same in the kernels with and without the sketch)."""
    if BLOCK >= 8:
        x0, x1, x2, x3, x4, x5, x6, x7 = _eighths(e, BLOCK)
        return x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7
    else:
        return e


@triton.jit
def fold8_dot(e, d, BLOCK: tl.constexpr):
    """[BLOCK] -> [BLOCK // 8]: sum of e * d over each 8 neighbours as one FMA chain (1 FMUL and 7
    FFMA per 8 elements, where a product then the tree's add is 2 instructions per element)."""
    if BLOCK >= 8:
        e0, e1, e2, e3, e4, e5, e6, e7 = _eighths(e, BLOCK)
        d0, d1, d2, d3, d4, d5, d6, d7 = _eighths(d, BLOCK)
        acc = tl.fma(e1, d1, e0 * d0)
        acc = tl.fma(e2, d2, acc)
        acc = tl.fma(e3, d3, acc)
        acc = tl.fma(e4, d4, acc)
        acc = tl.fma(e5, d5, acc)
        acc = tl.fma(e6, d6, acc)
        return tl.fma(e7, d7, acc)
    else:
        return e * d


@triton.jit
def _exp_parts(h, m, BLOCK: tl.constexpr):
    """_exp_parts_clamped for rows where d = h - m is finite at every lane (VARIANT 10's -inf halves
    read as the format's lowest value): (e, fold8_sum(e), fold8_dot(e, d)), t's lanes e * d, no clamp,
    each 8 folded by FMAs; the caller's tree over fold8_sum(e) gives s as the kernel without the sketch does."""
    d = h - m
    e = exp_ftz(d)
    return e, fold8_sum(e, BLOCK), fold8_dot(e, d, BLOCK)


@triton.jit
def _sum4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _own_slots(lanes, BLOCK: tl.constexpr, LANES: tl.constexpr):
    """[LANES] per-lane totals -> [BLOCK // 8] in fold8_sum's layout (entry rep * LANES + l is lane l's 8
    elements of vector rep): each lane's total in its rep-0 entry, 0 elsewhere, so a tree over the row's
    fold8 partials sums them too, without an exchange between the threads of its own."""
    rep = tl.arange(0, BLOCK // (8 * LANES))[:, None]
    return tl.reshape(tl.where(rep == 0, lanes[None, :], tl.zeros_like(lanes)[None, :]), [BLOCK // 8])


@triton.jit
def _row_sums_lanes(fe, fed, a_sq, a_neg, BLOCK: tl.constexpr, LANES: tl.constexpr):
    """(s, t, sum of the lanes' squares, their -inf count) in one tree over fold8 partials fe, fed: a ROWS
    program's lane accumulators (a_sq [LANES, 1] float32, a_neg [LANES, 1] int32 of -inf masks: _lane_count_i32) ride in
    the row's sum tree instead of a tree of their own after the row (that one held the program's slot ~1 µs
    longer: 4096x16384 bf16 with the sketch 75.6 -> 74.3 µs without it, stop 37). s is still tl.sum's value of
    fe (the same lanes and tree, adds only), so y is the same bits as without the sketch."""
    sq = _own_slots(tl.sum(a_sq, 1), BLOCK, LANES)
    ng = _own_slots(tl.sum(_lane_count_i32(a_neg), 1), BLOCK, LANES)
    if INTERPRET:
        return tl.sum(fe, 0), tl.sum(fed, 0), tl.sum(sq, 0), tl.sum(ng, 0)
    else:
        return tl.reduce((fe, fed, sq, ng), 0, _sum4)


@triton.jit
def _row_tree(fe, fed, a_sq, a_neg, MERGE: tl.constexpr, BLOCK: tl.constexpr, LANES: tl.constexpr):
    """(s, t, the row's lane squares, its lane -inf count): _row_sums_lanes where MERGE, else (s, t) of
    _sum_pair and zeros (the lanes then go on to the program's flushes)."""
    if MERGE:
        return _row_sums_lanes(fe, fed, a_sq, a_neg, BLOCK, LANES)
    else:
        s, t = _sum_pair(fe, fed)
        return s, t, tl.zeros((), dtype=tl.float32), tl.zeros((), dtype=tl.int32)


@triton.jit
def _sub_opaque(h, m):
    """h - m (sub.rn.f32, the bits of `h - m`) that LLVM cannot hoist out of a branch: VARIANT 8's
    two branches both compute h - m, and the hoisted copy kept h and d live together (64 registers
    across the branch: 192 bytes of spills at the 64-register cap in an offline sm_90 compile)."""
    if INTERPRET:
        return h - m
    else:
        return tl.inline_asm_elementwise("sub.rn.f32 $0, $1, $2;", "=r,r,r", [h, m], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _mul_opaque(h, c):
    """h * c (mul.rn.f32) that LLVM cannot merge with the selects before the max tree: VARIANT 4's
    HUGE branch must not keep the row's zero-masked copy alive across the tree (32 registers)."""
    if INTERPRET:
        return h * c
    else:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [h, c], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _peaked_exp(s, t, peak_nats):
    """_peaked without the log: H = log(s) - t/s < peak_nats  <=>  s < exp(peak_nats + t/s) (exp is
    monotone; t <= 0, so the argument is at most peak_nats). A ~30-instruction accurate logf per row
    becomes an approximate exp (~5). A NaN s compares false (0)."""
    return (s < tl.exp(peak_nats + t / s)).to(tl.int32)


@triton.jit
def _row_is_slow(X_row, n_cols, CHUNK: tl.constexpr):
    """The main loop's `ok` test, lane by lane: True if the row has a NaN, +inf or finite |h| >= BIG."""
    nbad = tl.zeros((), dtype=tl.int32)
    for c in tl.range(0, n_cols, CHUNK):
        cc = c + tl.arange(0, CHUNK)
        h = tl.load(X_row + cc, mask=cc < n_cols, other=-float("inf")).to(tl.float32)
        bad = (h != -float("inf")) & ~(tl.abs(h) < BIG)  # NaN compares false
        nbad += tl.sum(bad.to(tl.int32), 0)
    return nbad > 0


@triton.jit
def _unpacked(w, BF16: tl.constexpr, BLOCK: tl.constexpr):
    """The [BLOCK] float32 row of words w, in element order."""
    lo, hi = unpack(w, BF16)
    return join_pairs(lo, hi, BLOCK // 2)


# bf16 rows of HF's masked attention hold its mask value, the lowest finite bf16 (LOWEST_BF16), whose square
# overflows float32. The loop leaves those halves out of its plain squares and, in a row whose only huge
# values they are (min == LOWEST_BF16, max < HUGE), adds count * LOWEST_SQ_SCALED to the scaled lanes: an HSET2
# and an add a word where the HUGE branch re-took every square scaled (two unpacks, a multiply and the squares'
# FMAs a word). LOWEST_SQ_SCALED is (LOWEST_BF16 * HUGE_SCALE)^2, exact in float32 (16
# significant bits). A row that holds another finite value <= -HUGE beside them overflows its plain squares
# to inf: its program takes the exact pass, as for NaN.
LOWEST_SQ_SCALED: tl.constexpr = tl.constexpr((2.0 - 2.0**-7) ** 2 * 2.0**110)


@triton.jit
def _lowest_squares(wd, BLOCK: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr, KEEP: tl.constexpr):
    """Each lane's lowest-bf16 halves of words wd, as their squares scaled by HUGE_SCALE^2 ([LANES, KEEP])."""
    cnt = lane_sum(lowest_mask(wd), BLOCK // 2, LANES, VEC // 2, KEEP)
    return _lane_count_i32(cnt).to(tl.float32) * LOWEST_SQ_SCALED


@triton.jit
def _lane_count_i32(a_neg):
    """VARIANT 10's int32 lanes, each a sum of words' 0xFFFF-per-half masks (neg_inf_mask, lowest_mask), ->
    each lane's count of such halves. Summed as they are, not first ANDed down to one bit a half: one
    instruction a word fewer. A lane of L low and H high halves (each < 2^16, as the flushes keep them) holds
    S = L * 0xFFFF + H * 0xFFFF0000 = 2^16 (L - H) - L (mod 2^32), so L = -S mod 2^16,
    L - H = (S + L) / 2^16 mod 2^16, and H = L - (L - H) mod 2^16."""
    low = (-a_neg) & 0xFFFF
    diff = ((a_neg + low) >> 16) & 0xFFFF
    return low + ((low - diff) & 0xFFFF)


@triton.jit
def _sum3(a0, a1, a2, b0, b1, b2):
    return a0 + b0, a1 + b1, a2 + b2


@triton.jit
def _lane_totals(a_sq, a_huge, a_neg, VARIANT: tl.constexpr):
    """The lane accumulators' totals: (sum of squares as float64, the HUGE lanes unscaled; -inf count
    as int64, padding included). a_neg holds float32 lanes, or (VARIANT 10) int32 lanes of summed -inf masks
    (_lane_count_i32: fewer than 2^16 halves of each kind a lane, FLUSH rows of BLOCK // (2 * LANES)).
    One tree for the three, so one shared-memory exchange between the warps, not three. Its float sums
    need not be tl.sum's bits (_common.sum_and_max); the sketch's sums need not be. Every persistent
    program runs this at its end, all at about the same time, so its barriers are the launch's tail."""
    if VARIANT == 10:
        cnt = _lane_count_i32(a_neg)
    else:
        cnt = a_neg
    hg = a_huge.to(tl.float64)
    if INTERPRET:
        sq, hs, ng = tl.sum(a_sq), tl.sum(hg), tl.sum(cnt)
    else:
        sq, hs, ng = tl.reduce((a_sq, hg, cnt), None, _sum3)
    return sq.to(tl.float64) + hs * HUGE_UNSCALE, ng.to(tl.int64)


@triton.jit
def _softmax_kernel(
    X_ptr,  # x as (n_rows, n_cols) in dtype, last dim contiguous
    X_row_stride,
    Y_ptr,  # y as (n_rows, n_cols) in the output dtype, contiguous
    Y_row_stride,
    S_ptr,  # sketch features, float64 (11,); unused unless SKETCH
    F_ptr,  # workspace float64 slots (sumsq, max, min, max row range, min row max)
    I_ptr,  # workspace int64 slots (ticket, nonfinite, -inf count, masked | peaked rows << 32, eligible rows)
    M_ptr,  # ROWS: row record words, int64 (>= 2 * n_rows,), all -1 (sketch_buffer.row_records)
    T_ptr,  # PROBE 131072 (bench only): int64 globaltimer stamps, the rows' starts and ends, then the finisher's
    n_rows,
    n_cols,
    peak_nats,  # fp32: entropy below which a row is peaked
    BLOCK: tl.constexpr,
    SKETCH: tl.constexpr,
    STAGES: tl.constexpr,  # loads in flight in the row loop (1: none ahead; >1: async copies)
    VARIANT: tl.constexpr,  # sketch layout 3, 4 or 8 (see VARIANT above); 0 without SKETCH
    CHUNK: tl.constexpr,  # columns per piece of the chunked slow paths
    VEC: tl.constexpr,  # elements per 16-byte vector of x (VARIANT >= 4: the lane accumulators)
    LANES: tl.constexpr,  # lanes of the accumulators (threads; _common.lane_shape)
    KEEP: tl.constexpr,  # independent accumulator chains per lane (divides VEC; _common's lane partials)
    FLUSH: tl.constexpr,  # rows between float64 flushes of the lane sums of squares
    EVEN: tl.constexpr = False,  # BLOCK == n_cols (no padding lanes); VARIANT 8 only, False elsewhere
    PACKED: tl.constexpr = False,  # VARIANT 10: x read as words of two 16-bit elements (packed16.packable, or WINDOW)
    BF16: tl.constexpr = False,  # PACKED: the halves are bf16 (else fp16)
    NEG_PAIR: tl.constexpr = 0,  # PACKED: a word of two -inf halves (padding words)
    NEG_SAFE: tl.constexpr = 0.0,  # VARIANT 10: rows with a max above this take t without the clamp
    PF_BYTES: tl.constexpr = 0,  # bytes of a row to prefetch into L2 (_common.prefetch_l2); 0: none
    pf_ahead=0,  # the row prefetched is pf_ahead rows past the one being read
    ALIGN: tl.constexpr = 1,  # n_cols and both row strides are multiples of it (_common.column_multiple)
    WINDOW: tl.constexpr = False,  # rows read and written in aligned VEC-element vectors (_window; PACKED: as words)
    ROWS: tl.constexpr = False,  # VARIANT 10: a program per row, its partials in row records, and the finisher
    POLL: tl.constexpr = 512,  # ROWS: rows whose records the finisher reads at once
    FINISHER_FIRST: tl.constexpr = True,  # ROWS: program 0 finishes (a GPU starts it first); else program n_rows
    PROBE: tl.constexpr = 0,  # bench only, VARIANT 10 (y stays the same; the sketch is then wrong), bits: 1 no t
    # (s alone), 2 no min (a plain max tree), 4 no lane accumulators, 8 no per-row scalars, 16 no flushes (nor
    # the lane totals at the end: n_left stays FLUSH),
    # 32 no publish (no atomics, no ticket, no features written), 64 no -inf mask (the op on the words alone),
    # 128 the publish's ticket and end without its atomics (256, the HUGE branch without its -inf test, went with
    # that test in stop 39), 512 only every 8th program merges, 1024 no float merges, 2048 no integer merges,
    # 4096 ROWS: no records stored and none polled (the finisher returns at once; the records stay at their
    # sentinel), 8192 ROWS: the finisher returns at once (the rows' records stay set: the bench resets them,
    # sketch_buffer.reset_state), 131072:
    # globaltimer stamps into T_ptr (bench/finisher_timeline.py). Stop 37's 16384 (relaxed polls) and 32768 / 65536
    # (naps between polls) moved nothing and are gone (ab33ac9 has them)
):
    # a ROWS program's one row: its lane accumulators ride in its sum tree (_row_sums_lanes), no tree after it
    MERGE: tl.constexpr = ROWS and VARIANT == 10 and BLOCK >= 8 * LANES and PROBE // 16 % 2 == 0
    pid = tl.program_id(0)
    finisher = pid < 0  # never: a runtime False (a constant one still compiled the branch below)
    if ROWS:
        finisher = pid == (0 if FINISHER_FIRST else n_rows)
    if finisher:
        if ROWS and PROBE // 4096 % 2 == 0 and PROBE // 8192 % 2 == 0:  # the finisher polls the rows' records
            _finish_row_records(S_ptr, F_ptr, I_ptr, M_ptr, n_rows, n_cols, POLL, T_ptr, PROBE // 131072 % 2 == 1)
    else:
        n_cols, X_row_stride, Y_row_stride = aligned_rows(n_cols, X_row_stride, Y_row_stride, ALIGN)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        if SKETCH:
            p_max, p_min, p_rng, p_rmx, p_sq, p_nf, p_neg, p_masked, p_peak, p_elig = fresh_partials()
            p_bad = tl.zeros((), dtype=tl.int32)  # rows left to the exact pass after the loop
            if VARIANT >= 4:
                a_sq = tl.zeros([LANES, KEEP], dtype=tl.float32)  # per lane: sum of h*h over non-(-inf) entries
                if VARIANT == 10:  # per lane the sum of the words' -inf masks (_lane_count_i32)
                    a_neg = tl.zeros([LANES, KEEP], dtype=tl.int32)
                else:
                    a_neg = tl.zeros([LANES, KEEP], dtype=tl.float32)  # per lane: -inf count (padding included; exact, flushed)
                a_huge = tl.zeros([LANES, KEEP], dtype=tl.float32)  # VARIANT 4: sum of (h * 2^-72)^2 over rows with |h| >= HUGE
                n_left = tl.full((), FLUSH, tl.int32)  # rows until the next flush of a_sq
                n_fast = tl.zeros((), dtype=tl.int32)  # VARIANT 8: rows of the fast branch (their padding is not in a_neg)
                if WINDOW:  # per edge lane (_count_edges): float64 squares, the row's non-(-inf) entries
                    e_sq = tl.zeros([2 * VEC], dtype=tl.float64)
                    e_num = tl.zeros([2 * VEC], dtype=tl.int32)
        if PACKED:
            wcols = tl.arange(0, BLOCK // 2)
            wmask = wcols < n_cols // 2
        if ROWS:  # this program's one row (program 0 finishes on a GPU)
            r_first = pid - 1 if FINISHER_FIRST else pid
            r_end = r_first + 1
            r_step = 1
        else:  # persistent: rows pid, pid + grid, ...
            r_first = pid
            r_end = n_rows
            r_step = tl.num_programs(0)
        for r in tl.range(r_first, r_end, r_step, num_stages=STAGES):
            row = tl.cast(r, tl.int64)
            if PROBE // 131072 % 2 == 1:
                tl.store(T_ptr + row, globaltimer(row))
            prefetch_row(X_ptr, r, pf_ahead, n_rows, X_row_stride, PF_BYTES, VEC if WINDOW else 1)
            if PACKED and WINDOW:  # the words of the row's whole vectors (_window), its edges as elements
                start, off, first, end = _window(row, X_row_stride, n_cols, VEC)
                wm = _whole(first, end, BLOCK // 2, VEC // 2)
                # the same vectors as element lanes, for y's store (not wm joined to itself: that reshape moved
                # through shared memory every row, H200 4096x16383 bf16 with the sketch 333 µs)
                inner = _whole(first, end, BLOCK, VEC)
                pos, edge = _edges(off, first, end, n_cols, VEC)
                Xw = (X_ptr + start).to(tl.pointer_type(tl.int32))
                w = tl.load(Xw + wcols, mask=wm, other=NEG_PAIR, eviction_policy="evict_first")
                he = tl.load(X_ptr + start + pos, mask=edge, other=-float("inf")).to(tl.float32)  # read n (dtype)
            elif PACKED:
                wm = wmask
                Xw = (X_ptr + row * X_row_stride).to(tl.pointer_type(tl.int32))
                w = tl.load(Xw + wcols, mask=wm, other=NEG_PAIR, eviction_policy="evict_first")  # read n (dtype)
            elif WINDOW:  # a row no power of two divides: its interior in whole vectors, its edges apart (_window)
                start, off, first, end = _window(row, X_row_stride, n_cols, VEC)
                inner = _whole(first, end, BLOCK, VEC)
                pos, edge = _edges(off, first, end, n_cols, VEC)
                x = tl.load(X_ptr + start + cols, mask=inner, other=-float("inf"), eviction_policy="evict_first")
                he = tl.load(X_ptr + start + pos, mask=edge, other=-float("inf")).to(tl.float32)  # read n (dtype)
                h = x.to(tl.float32)
            else:
                x = tl.load(X_ptr + row * X_row_stride + cols, mask=mask, other=-float("inf"),
                            eviction_policy="evict_first")  # read n (dtype)
                h = x.to(tl.float32)
            if SKETCH and VARIANT == 8:
                # max tree: (max, plain min over the row's columns): no -inf mask before the branch
                if EVEN:
                    hm = h
                else:
                    hm = tl.where(mask, h, float("inf"))  # padding (loaded as -inf) stays out of the min
                if INTERPRET:
                    m, rmin = tl.max(h, 0), tl.min(hm, 0)
                else:
                    m, rmin = tl.reduce((h, hm), 0, _max_min)
                if rmin > -float("inf"):  # no masked column: no per-element selects (EVEN)
                    if EVEN:
                        a_sq += lane_sum_squares(h, BLOCK, LANES, VEC, KEEP)  # NaN/+inf/overflow: caught after the loop
                        d = h - m
                        e = exp_ftz(d)
                        ed = e * d  # -inf only if h - m overflows (|h| ~ FMAX): t NaN, redone below
                    else:
                        hz = tl.where(mask, h, 0.0)
                        a_sq += lane_sum_squares(hz, BLOCK, LANES, VEC, KEEP)
                        d = h - m
                        e = exp_ftz(d)
                        ed = e * tl.maximum(d, -FMAX)  # padding: 0 * -FMAX
                    s, t = _row_sums(e, ed, BLOCK)
                    if not EVEN:
                        n_fast += 1
                else:  # masked columns (or a fully masked row): layout 4's per-element selects
                    ninf = h == -float("inf")
                    hz = tl.where(ninf, 0.0, h)
                    a_sq += lane_sum_squares(hz, BLOCK, LANES, VEC, KEEP)
                    a_neg += lane_sum(tl.where(ninf, 1.0, 0.0), BLOCK, LANES, VEC, KEEP)  # padding included
                    # min over non-(-inf) lanes, first inside each thread, so h's lanes die into it as in
                    # layout 4's max tree (a [BLOCK] lo kept for the sum tree spilled at 64 registers)
                    lo = lane_min(tl.where(ninf, float("inf"), h), BLOCK, LANES, VEC, KEEP)  # [LANES, KEEP]
                    d = _sub_opaque(h, m)  # h - m, not hoisted above the branch
                    e = exp_ftz(d)
                    s, t = _row_sums(e, e * tl.maximum(d, -FMAX), BLOCK)
                    rmin = tl.min(tl.min(lo, 1), 0)  # across threads: one value each
            elif SKETCH and VARIANT == 10:  # layout 4 on the words (PACKED)
                if PROBE // 64 % 2 == 1:  # bench only: the op on words, no -inf mask (PROBE 127: the word path's own cost)
                    m = tl.max(_unpacked(w, BF16, BLOCK), 0)
                    rmin = m
                    e = exp_ftz(_unpacked(w, BF16, BLOCK) - m)
                    s = tl.sum(fold8_sum(e, BLOCK), axis=0)
                    t = tl.zeros((), dtype=tl.float32)
                else:
                    ninf = neg_inf_mask(w, BF16)  # 0xFFFF per -inf half, summed as it is (_lane_count_i32)
                    a_prev = a_sq
                    if BF16:  # HF's mask value (finfo.min) leaves the plain squares: counted in its rows below
                        wz = w & ~(ninf | lowest_mask(w))
                    else:
                        wz = w & ~ninf
                    if PROBE // 4 % 2 == 0:
                        a_neg += lane_sum(ninf, BLOCK // 2, LANES, VEC // 2, KEEP)  # padding included
                        a_sq += lane_sum_squares(_unpacked(wz, BF16, BLOCK), BLOCK, LANES, VEC, KEEP)  # HUGE rows below
                    # only wd lives across the max tree, its -inf halves read as a finite value whose e is still 0
                    # where m > NEG_SAFE: bf16 -2^32 (NEG_MAP_PAIR, one LOP3 a word), whose scaled square in a HUGE
                    # row's sum is below half an ulp of any square there (below); fp16 its lowest value
                    # (0xFC00 - 1 = 0xFBFF: fp16 has no HUGE rows but +inf ones, which the exact pass redoes)
                    if BF16:
                        wd = (w & ~ninf) | (ninf & NEG_MAP_PAIR)
                    else:
                        wd = w - (ninf & LOW_BITS_PAIR)
                    if PROBE // 2 % 2 == 0:
                        m, rmin = row_max_min(w, w ^ (ninf & SIGN_PAIR), BF16)  # the min's -inf halves made +inf
                    else:
                        m = tl.max(_unpacked(w, BF16, BLOCK), 0)
                        rmin = m
                    if WINDOW:
                        m, rmin = _merge_edges(m, rmin, he)
                        e_sq, e_num = _count_edges(e_sq, e_num, he, edge)
                    if PROBE // 4 % 2 == 1:
                        pass
                    elif BF16 and (rmin == LOWEST_BF16) & (m < HUGE):  # an HF-masked row (see LOWEST_SQ_SCALED)
                        a_huge += _lowest_squares(wd, BLOCK, LANES, VEC, KEEP)
                        if MERGE:  # the row's lanes ride its sum tree as one scaled value (unscaled after it)
                            a_huge += (a_sq * HUGE_SCALE) * HUGE_SCALE
                            a_sq = a_prev
                    elif tl.maximum(m, -rmin) >= HUGE:  # a finite |h| >= HUGE (every HF-masked row) or +inf
                        # as layout 4: the squares scaled, in their own lanes, straight from wd. Its -inf halves
                        # (padding too) add 2^-80 each, at most 2^-64 a row (65536 halves): below half an ulp
                        # (2^-56) of the smallest scaled HUGE square (2^-32), so every sum they join rounds to the
                        # same bits as without them. Before, a tree of the row's -inf count chose between wd, a select and an
                        # L2 re-read (stop 29: that test was 4.2 of HF-masked rows' sketch µs)
                        a_sq = a_prev
                        hs = _mul_opaque(_unpacked(wd, BF16, BLOCK), HUGE_SCALE)  # the lowest values included
                        a_huge += lane_sum_squares(hs, BLOCK, LANES, VEC, KEEP)
                    # d finite at every lane: t without the clamp. Not where the row's range or the lowest
                    # value's distance to m overflows float32 (3e38 beside -3e38: d = -inf, e * d = NaN)
                    if PROBE % 2 == 1:
                        e = exp_ftz(_unpacked(wd, BF16, BLOCK) - m)
                        fe = fold8_sum(e, BLOCK)
                        s, t, row_sq, row_neg = _row_tree(fe, tl.zeros_like(fe), a_sq + a_huge, a_neg, MERGE, BLOCK,
                                                          LANES)
                    elif (m > NEG_SAFE) & (m < POS_SAFE) & (m - rmin <= FMAX):
                        e, fe, fed = _exp_parts(_unpacked(wd, BF16, BLOCK), m, BLOCK)
                        s, t, row_sq, row_neg = _row_tree(fe, fed, a_sq + a_huge, a_neg, MERGE, BLOCK, LANES)
                    else:  # a row of the lowest value itself (a fully masked HF row), of -inf, or NaN: re-read
                        w2 = tl.load(Xw + wcols, mask=wm, other=NEG_PAIR)
                        e, fe, fed = _exp_parts_clamped(_unpacked(w2, BF16, BLOCK), m, BLOCK)
                        s, t, row_sq, row_neg = _row_tree(fe, fed, a_sq + a_huge, a_neg, MERGE, BLOCK, LANES)
                    if MERGE:  # the row's squares and -inf count came with its sums: no flush, no tree after the row
                        huge_row = tl.maximum(m, -rmin) >= HUGE  # its squares are scaled (the HUGE branch above)
                        row_sq64 = row_sq.to(tl.float64)
                        p_sq += tl.where(huge_row, row_sq64 * HUGE_UNSCALE, row_sq64)
                        p_neg += row_neg.to(tl.int64)
                    if WINDOW:
                        ee, s, t = _add_edge_sums(s, t, he, m)
            elif SKETCH and VARIANT == 4:
                ninf = h == -float("inf")
                hz = tl.where(ninf, 0.0, h)
                a_prev = a_sq  # kept for a HUGE row, whose plain squares overflow (one register)
                # the squares before the max tree, as without the HUGE branch: added after it (the branch
                # choosing) the lane sums lost their overlap with the tree, 124.3 against 114.9 µs with
                # the sketch on the H200 (bench/results/norm_chunks_h200_s16d.md)
                a_sq += lane_sum_squares(hz, BLOCK, LANES, VEC, KEEP)  # NaN/+inf/overflow: non-finite, caught after the loop
                # as a float select, not ninf.to(int32): an i1 vector used twice was packed into bitmasks
                # and unpacked lane by lane (+2 instructions per element in the SASS)
                a_neg += lane_sum(tl.where(ninf, 1.0, 0.0), BLOCK, LANES, VEC, KEEP)
                lo = tl.where(ninf, float("inf"), h)
                if INTERPRET:
                    m, rmin = tl.max(h, 0), tl.min(lo, 0)
                else:
                    m, rmin = tl.reduce((h, lo), 0, _max_min)
                if WINDOW:
                    m, rmin = _merge_edges(m, rmin, he)
                    e_sq, e_num = _count_edges(e_sq, e_num, he, edge)
                if tl.maximum(m, -rmin) >= HUGE:  # a finite |h| >= HUGE (every HF-masked row) or +inf
                    a_sq = a_prev  # its squares go scaled by 2^-72 to their own lanes instead (see HUGE)
                    hs = _mul_opaque(h, HUGE_SCALE)
                    hs = tl.where(hs == -float("inf"), 0.0, hs)
                    a_huge += lane_sum_squares(hs, BLOCK, LANES, VEC, KEEP)  # +inf stays non-finite: the exact pass
                e, s, t = _exp_sums_clamped(h, m, BLOCK)
                if WINDOW:
                    ee, s, t = _add_edge_sums(s, t, he, m)
            elif SKETCH:  # VARIANT 3
                # one tree: the op's max and the sketch's sum of squares (-inf lanes, incl. padding, add
                # 0; NaN/+inf make it non-finite), smallest non-masked entry and the -inf count
                ninf = h == -float("inf")
                q = tl.where(ninf, 0.0, h * h)
                lo = tl.where(ninf, float("inf"), h)
                neg = tl.where(ninf, 1.0, 0.0)  # count padding too and subtract it: no column mask in the loop
                if INTERPRET:
                    m, sq, rmin, nneg = tl.max(h, 0), tl.sum(q, 0), tl.min(lo, 0), tl.sum(neg, 0)
                else:
                    m, sq, rmin, nneg = tl.reduce((h, q, lo, neg), 0, _combine4)
                nneg -= BLOCK - n_cols
                e, s, t = _exp_sums_clamped(h, m, BLOCK)
            else:
                m = tl.max(h, axis=0)
                if WINDOW:
                    m = tl.maximum(m, tl.max(he, 0))  # as _merge_edges
                e = exp_ftz(h - m)  # approximate exp; padding lanes give exp(-inf) = 0
                s = tl.sum(fold8_sum(e, BLOCK), axis=0)  # fp32 tree sum, each 8 neighbours first
                if WINDOW:
                    ee, s, _ = _add_edge_sums(s, s, he, m)
            y = div_by_row(e, s)
            if WINDOW:
                tl.store(Y_ptr + start + cols, store_cast(y, Y_ptr.dtype.element_ty), mask=inner, eviction_policy="evict_first")
                tl.store(Y_ptr + start + pos, store_cast(div_by_row(ee, s), Y_ptr.dtype.element_ty), mask=edge)  # write n
            else:
                tl.store(Y_ptr + row * Y_row_stride + cols, store_cast(y, Y_ptr.dtype.element_ty), mask=mask,
                         eviction_policy="evict_first")  # write n
            if PROBE // 131072 % 2 == 1:  # the row's end (a ROWS program's is after its record store, below)
                tl.store(T_ptr + n_rows + row, globaltimer(row))
            if SKETCH and VARIANT >= 4 and PROBE // 8 % 2 == 0:  # scalars only; a program with NaN/+inf rows redoes them after the loop
                p_min = tl.minimum(p_min, rmin)  # fully masked rows: rmin = +inf
                # half the range, in float32: a row can hold 3e38 and -3e38, whose difference is inf in
                # float32 but not its half (halving commutes with the rounding); fully masked rows: -inf
                p_rng = tl.maximum(p_rng, 0.5 * m - 0.5 * rmin)
                p_max = tl.maximum(p_max, m)  # fully masked rows: m = -inf
                p_rmx = tl.minimum(p_rmx, tl.where(m > -float("inf"), m, float("inf")))
                p_masked += (m == -float("inf")).to(tl.int32)
                p_elig += (s <= FMAX).to(tl.int32)  # NaN for NaN/+inf rows and rows with no finite entry
                p_peak += _peaked_exp(s, t, peak_nats)  # a NaN s compares false
            if SKETCH and VARIANT >= 4:
                if not MERGE and PROBE // 16 % 2 == 0:
                    n_left -= 1
                    if n_left == 0:
                        # the counts stay <= FLUSH * BLOCK between flushes: exact in float32 lanes
                        sq_total, neg_total = _lane_totals(a_sq, a_huge, a_neg, VARIANT)
                        p_sq += sq_total
                        p_neg += neg_total
                        a_sq = tl.zeros([LANES, KEEP], dtype=tl.float32)
                        a_huge = tl.zeros([LANES, KEEP], dtype=tl.float32)
                        a_neg = tl.zeros_like(a_neg)
                        n_left = FLUSH
            elif SKETCH:  # scalars only, so h dies at the store; rows with NaN/+inf wait for the exact pass
                # no NaN/+inf and every finite |h| < BIG (squares cannot overflow): a test _row_is_slow repeats
                ok = (sq <= FMAX) & (tl.maximum(m, -rmin) < BIG)
                has = ok & (m >= rmin)  # the row has a finite entry
                p_max = tl.maximum(p_max, tl.where(has, m, -float("inf")))
                p_min = tl.minimum(p_min, tl.where(has, rmin, float("inf")))
                p_rng = tl.maximum(p_rng, tl.where(has, m - rmin, 0.0))
                p_rmx = tl.minimum(p_rmx, tl.where(has, m, float("inf")))
                p_sq += tl.where(ok, sq, 0.0).to(tl.float64)
                p_neg += tl.where(ok, nneg, 0.0).to(tl.int64)
                p_masked += (ok & (nneg == n_cols)).to(tl.int32)
                p_elig += has.to(tl.int32)
                p_peak += tl.where(has, _peaked(s, t, peak_nats), 0)
                p_bad += tl.where(ok, 0, 1)
        if SKETCH and VARIANT >= 4:
            if not MERGE and n_left != FLUSH:  # rows since the last flush (none where a program's last row flushed)
                sq_total, neg_total = _lane_totals(a_sq, a_huge, a_neg, VARIANT)
                p_sq += sq_total
                p_neg += neg_total
            mine = tl.cdiv(r_end - r_first, r_step)  # rows of this program
            if VARIANT == 8:
                mine -= n_fast  # fast-branch rows added no padding to a_neg
            p_neg -= (BLOCK - n_cols) * tl.cast(mine, tl.int64)  # the padding's -inf
            if WINDOW:
                p_sq += tl.sum(e_sq, 0)
                p_neg -= tl.sum(e_num, 0).to(tl.int64)
            exact = ~(p_sq <= 1e308)  # NaN/+inf (not in the lane sums: they made them non-finite)
            if exact:  # rare: NaN/+inf (or squares overflowed): exact statistics of every row
                p_max = tl.full((), -float("inf"), tl.float32)
                p_min = tl.full((), float("inf"), tl.float32)
                p_rng = tl.zeros((), dtype=tl.float32)  # VARIANT >= 4: half the widest row range
                p_rmx = tl.full((), float("inf"), tl.float32)
                p_sq = tl.zeros((), dtype=tl.float64)
                p_neg = tl.zeros((), dtype=tl.int64)
                p_masked = tl.zeros((), dtype=tl.int32)
                if VARIANT == 8:  # the fast branch's t is NaN where h - m overflowed (squares overflow too)
                    p_elig = tl.zeros((), dtype=tl.int32)
                    p_peak = tl.zeros((), dtype=tl.int32)
                for r2 in tl.range(r_first, r_end, r_step):
                    if VARIANT == 8:
                        sq2, nf, nneg2, rmax, rmin2, elig2, peak2 = _exact_row_chunked(
                            X_ptr + tl.cast(r2, tl.int64) * X_row_stride, n_cols, peak_nats, CHUNK)
                        p_elig += elig2
                        p_peak += peak2
                    else:
                        sq2, nf, nneg2, rmax, rmin2 = _row_stats_chunked(
                            X_ptr + tl.cast(r2, tl.int64) * X_row_stride, n_cols, CHUNK)
                    p_max, p_min, p_rng, p_rmx = _merge_extremes(p_max, p_min, p_rng, p_rmx, rmax, rmin2, F_ptr)
                    p_sq += sq2
                    p_nf += nf
                    p_neg += nneg2
                    p_masked += (nneg2 == n_cols).to(tl.int32)
        elif SKETCH:  # noqa: SIM102 - VARIANT 3 (a constexpr test), then a runtime one
            if p_bad > 0:  # rare: re-read this program's slow rows in CHUNK pieces
                for r2 in tl.range(r_first, r_end, r_step):
                    X_row = X_ptr + tl.cast(r2, tl.int64) * X_row_stride
                    if _row_is_slow(X_row, n_cols, CHUNK):
                        sq2, nf, nneg2, rmax, rmin2, elig2, peak2 = _exact_row_chunked(
                            X_row, n_cols, peak_nats, CHUNK)
                        p_max, p_min, p_rng, p_rmx = _merge_extremes(p_max, p_min, p_rng, p_rmx, rmax, rmin2, F_ptr)
                        p_sq += sq2
                        p_nf += nf
                        p_neg += nneg2
                        p_masked += (nneg2 == n_cols).to(tl.int32)
                        p_elig += elig2
                        p_peak += peak2
        if SKETCH and ROWS:
            if PROBE // 4096 % 2 == 0:
                _store_row_record(M_ptr, r_first, F_ptr, I_ptr, p_max, p_min, p_rng, p_rmx, p_sq, p_nf, p_neg, p_masked,
                                  p_peak, p_elig, exact)
            if PROBE // 131072 % 2 == 1:  # the row program's end: after its record store
                tl.store(T_ptr + n_rows + r_first, globaltimer(r_first))
        elif SKETCH and PROBE // 32 % 2 == 0:
            publish_sketch(S_ptr, F_ptr, I_ptr, p_max, p_min, p_rng, p_rmx, p_sq, p_nf, p_neg, p_masked, p_peak, p_elig,
                           n_rows, n_cols, tl.num_programs(0), 2.0 if VARIANT >= 4 else 1.0,
                           PROBE // 128 % 2 + PROBE // 1024 % 2 * 2 + PROBE // 2048 % 2 * 4 + PROBE // 512 % 2 * 8)


# Warps for rows no power of two divides read element by element (ALIGN 1 where windowed() does not apply:
# an address register per element), per (BLOCK, element bytes), where TUNED_BY_ELEMENT's 64 elements a
# thread lost. H200 bf16, µs without / with the sketch (bench/results/softmax_odd_*_h200_s32.md): 16384x2047
# 2 warps 62.3 / 193.5, 8 warps 54.7 / 138.0. Kept at TUNED_BY_ELEMENT's where they won or tied: 4096x4095
# 41.9 / 63.6 (8 warps 41.8 / 85.4), 4096x8191 56.1 / 131.0 (16 warps 58.4 / 134.7), 4096x16383 163.3 /
# 448.3 (16 warps 177.9 / 650.3). Rows that windowed() takes load whole vectors and keep TUNED_BY_ELEMENT's.
UNALIGNED_WARPS: dict[tuple[int, int], int] = {(2048, 2): 8}


def unaligned_warps(n: int, esize: int, align: int) -> int | None:
    """UNALIGNED_WARPS' warps for rows of n elements of esize bytes at the launch's ALIGN, else None
    (launch_config's). The launches with and without the sketch see the same ALIGN, so the same warps
    (tl.sum's tree, so y, stays the same)."""
    return UNALIGNED_WARPS.get((next_pow2(n), esize)) if align == 1 else None


def _softmax_launch(
    x2: torch.Tensor, y2: torch.Tensor, buf: torch.Tensor | None, num_warps: int | None = None,
    stages: int | None = None, per_sm: int | None = None,
    variant: int | None = None, fusion: bool | None = None, maxnreg: int | None = None, keep: int | None = None,
    packed: bool | None = None, prefetch: float | None = None, piece: int | None = None, probe: int = 0,
    window: bool = True, rows: bool | None = None, poll: int | None = None, finisher_first: bool | None = None,
    timestamps: torch.Tensor | None = None, defer: bool = False,
) -> torch.Tensor | None:
    """Grid: one persistent program per resident slot (persistent_grid), each over its share of rows;
    without the sketch one program per row where _common.ROW_GRID lists the launch.
    num_warps / stages / per_sm / variant / fusion / maxnreg / keep override the tuned launch (the
    bench's sweep; maxnreg caps registers per thread, so a kernel keeps 2 programs per SM); piece the long
    rows' piece width (softmax_long), which sends shorter rows there too (the bench's comparison: rows past
    32768 hold 64 registers a thread at BLOCK 65536, and spill); probe: the kernel's PROBE (bench only: where
    the sketch's time goes, bench/RESULTS.md stop 28); window=False reads the rows that windowed() takes
    (layouts 0, 4 and 10) element by element, as layouts 3 and 8 always do (the bench's and tests'
    comparisons); rows: the sketched launch with a program per row (softmax_rows) or the persistent one
    (default: ROWS_BLOCKS' rows a program each); poll: rows whose records its finisher reads at once;
    finisher_first: the finisher is program 0 (default on a GPU) or the last; timestamps: int64 (2 * n_rows + polls
    + 1,) for PROBE 131072's globaltimer stamps (bench/finisher_timeline.py); defer (with buf None): the sketch
    wanted, finished later where the launch has a program per row (optwin.kernels.deferred: no finisher program
    in this launch; not inside CUDA graph capture, nor past deferred.MAX_ROWS rows).
    Returns the buffer the sketch goes to: buf, with defer a pending page buffer or a new one, or None."""
    n_rows, n = x2.shape
    if defer and buf is not None:
        raise InputError("softmax: defer makes its own sketch buffer; pass buf=None")
    if n > MAX_BLOCK or piece is not None:  # past what a program holds (or asked for): the chunked kernel
        buf = new_buffer("softmax", x2.device) if defer else buf
        softmax_long_launch(x2, y2, buf, PEAK_NATS, num_warps, maxnreg, piece)
        return buf
    sketch = buf is not None or defer
    if n_rows == 0 and not sketch:
        return buf
    xs, ys = x2.stride(0), y2.stride(0)
    key = ("softmax", x2.shape, xs, ys, x2.data_ptr() & 15, y2.data_ptr() & 15, x2.dtype, y2.dtype,
           x2.device, sketch, num_warps, stages, per_sm, variant, fusion, maxnreg, keep, packed, prefetch, probe, window,
           rows, poll, finisher_first, timestamps is None)
    p = kept(key) or _softmax_plan(x2, y2, sketch, num_warps, stages, per_sm, variant, fusion, maxnreg, keep, packed,
                                   prefetch, probe, window, rows, poll, finisher_first)
    by_row, p_deferred = p.extra
    # the sketch buffer and workspace looked up only now: a deferred call's are its page's (its host time
    # counts: bench/deferred_finish.py)
    defer = defer and p_deferred is not None and timestamps is None and deferred.takes(n_rows, x2.device)
    # a deferred call holds deferred.lock from its reservation until its launch is queued: a settle of its page
    # from another thread (a monitor's flush) then cannot queue the finisher ahead of the rows it polls for
    with deferred.launch_lock(defer):
        if defer:  # a program per row, its records to a page; the page's finisher runs later
            buf, m, f, i = deferred.reserve("softmax", x2.device, n_rows, n, words=2)
        else:
            buf = new_buffer("softmax", x2.device) if sketch and buf is None else buf
            f, i = workspace("softmax", x2.device) if sketch else (y2, y2)
            m = row_records("softmax", x2.device, n_rows, words=2, extra=0)[0] if by_row else y2
        args = (x2, xs, y2, ys, buf if sketch else y2, f, i, m,
                m if timestamps is None else timestamps, n_rows, n, PEAK_NATS)
        if defer:  # launched as its own fast_launch key; kept as the plan that holds it
            run((*key, "deferred"), p_deferred, args, kept_as=(key, p))
        else:
            run(key, p, args)
    return buf


def _softmax_plan(x2: torch.Tensor, y2: torch.Tensor, sketch: bool, num_warps: int | None, stages: int | None,
                  per_sm: int | None, variant: int | None, fusion: bool | None, maxnreg: int | None, keep: int | None,
                  packed: bool | None, prefetch: float | None, probe: int, window: bool, rows: bool | None,
                  poll: int | None, finisher_first: bool | None) -> Plan:
    """_softmax_launch's kernel, grid and options (rows a program holds) for this call's shape, strides,
    dtypes and overrides; extra: (a program per row, the plan of its deferred form or None)."""
    n_rows, n = x2.shape
    align = column_multiple(n, x2.stride(0), y2.stride(0))
    esize = x2.element_size()
    # words only for layout 10: the kernel without the sketch read them 1-3 µs slower at 4096x16384 bf16
    # (H200: 75.1 against stop 20's 73.9 µs, norm_chunks_h200_s21a.md; 77.9 against 74.5, _s21b.md)
    win = window and windowed(x2, y2, align)
    # packed=False: the bench's way to layout 4. A WINDOW row's whole vectors are words of the row's elements
    words = packable(x2) or (win and x2.dtype in NEG_INF_PAIR and n >= 16)
    packed = sketch and packed is not False and words
    var = ((PACKED_VARIANT if packed else VARIANT) if variant is None else variant) if sketch else 0  # no sketch: one kernel
    packed = packed and var == 10
    win = win and var in WINDOW_LAYOUTS
    block, warps, st, _ = launch_config("softmax", n, num_warps or (None if win else unaligned_warps(n, esize, align)),
                                        stages, esize=esize)
    if var not in LAYOUTS and sketch:
        raise InputError(f"softmax: no sketch layout {var} (layouts {', '.join(map(str, LAYOUTS))})")
    if var == 10 and not packed:
        raise InputError(f"softmax: sketch layout 10 reads 16-bit pairs; not for {x2.dtype} rows of {n}")
    fuse = ((var == 10 or FUSION) if fusion is None else fusion) and sketch
    vec, lanes = lane_shape(block, esize, warps)
    kp = min(KEEP if keep is None else keep, vec) if sketch and var >= 4 else 1
    if maxnreg is not None:
        cap = maxnreg
    elif sketch:
        cap = MAXNREG.get((block, warps)) if var >= 4 else None
    else:
        cap = PLAIN_MAXNREG.get((block, warps))
    even = var == 8 and block == n  # VARIANT 8's select-free branch needs no column mask
    by_row = var == 10 and (block in ROWS_BLOCKS and per_sm is None if rows is None else rows)
    key = ("softmax", x2.dtype, y2.dtype, block, warps, st, sketch, var, fuse, cap, kp, even, packed, probe, align,
           win, by_row)
    options = {"BLOCK": block, "SKETCH": sketch, "STAGES": st, "VARIANT": var, "CHUNK": min(CHUNK, block), "VEC": vec,
               "LANES": lanes, "KEEP": kp, "FLUSH": FLUSH, "EVEN": even, "PACKED": packed,
               "BF16": x2.dtype == torch.bfloat16, "NEG_PAIR": NEG_INF_PAIR.get(x2.dtype, 0),
               "NEG_SAFE": NEG_SAFE.get(x2.dtype, 0.0), "ALIGN": align, "WINDOW": win, "PROBE": probe, "ROWS": by_row,
               "POLL": poll or RECORD_POLL, "num_warps": warps, "enable_fp_fusion": fuse, **register_cap(cap)}

    def on_grid(grid: int, first: bool) -> Plan:
        pf = prefetch_args("softmax", block, x2, sketch, grid, key, prefetch, win)
        return plan(_softmax_kernel, (grid,), {**options, **pf, "FINISHER_FIRST": first}, key, warps)

    first = not INTERPRETED if finisher_first is None else finisher_first
    if by_row:  # a program per row and the finisher; deferred: no finisher (program n_rows would be it)
        return on_grid(n_rows + 1, first)._replace(extra=(True, on_grid(n_rows, False)))
    grid = persistent_grid(key, n_rows, x2.device, grid_per_sm("softmax", block, sketch, per_sm))
    return on_grid(grid, first)._replace(extra=(False, None))


def softmax(
    x: torch.Tensor, sketch: bool = True, out_dtype: torch.dtype | None = None, defer: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(softmax of x over the last dim, sketch features or None); y in out_dtype (default x's dtype).

    Read the features with optwin.kernels.read_sketch("softmax", buf). defer: where the launch runs a
    program per row, its finisher runs later, batched with other calls' (optwin.kernels.deferred); buf is
    then pending until read_sketch or deferred.settle_all().
    """
    check_device(x)
    check_rows("softmax", x)
    if out_dtype is not None and out_dtype not in DTYPES:
        raise InputError(f"softmax: out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    x2 = rows_view(x)  # (rows, n)
    y2 = torch.empty(x2.shape, dtype=out_dtype or x.dtype, device=x.device)  # (rows, n)
    buf = new_buffer("softmax", x.device) if sketch and not defer else None
    buf = _softmax_launch(x2, y2, buf, defer=sketch and defer)
    return y2.reshape(x.shape), buf
