"""Rotary position embedding in Triton, with the input sketch in the same pass (rope/triton).

    TRITON_INTERPRET=1 python -c "import torch; from optwin.kernels.rope import rope; \
print(rope(torch.randn(3, 2, 8), torch.arange(3))[0].shape)"

A tile is (BLOCK_H heads, d/2) of one sequence position for each half of the head dim; cos/sin are
computed once per tile and reused over its heads. Persistent programs walk the tiles
(position, head block) pid, pid + grid, ...; BLOCK_H and the warps come from a small table keyed
by the tile (ROPE_TUNED), so wide positions split into several tiles.

Numerics (what optwin.twin's rope/triton models), at position p, frequency j < d/2:
    inv[j] = 1 / base ** (2j / d)       # host, float32, exactly the spec's table (optwin.kernels.production)
    ang = float32(p) * inv[j]           # one fp32 product (p exact below 2^24)
    c, s = cos(ang), sin(ang)           # fp32 tl.cos / tl.sin (libdevice-class accuracy on NVIDIA per the
                                        # bench's large-position check; numpy in the interpreter)
    y1 = x1 * c - x2 * s                # = x*cos + rotate_half(x)*sin on the first half, fp32
    y2 = x2 * c + x1 * s                # second half, fp32; Triton may contract one product into an FMA
    y = cat(y1, y2).to(dtype)           # one rounding
Table mode (HF models: cos/sin given in dtype, [batch, seq, d]) loads both halves of cos/sin instead
of computing them, same combine. Tiling does not change the numerics (all elementwise).
Sketch: no per-position reduction at all; each program keeps running max |x| and sum x^2 in
registers, per lane ([LANES, KEEP]: each thread's own elements folded in-thread, LANE_ACC, at the
measured launches in ROPE_MAXNREG; the sum flushed to float64 every FLUSH tiles) or per tile
element elsewhere, and reduces them once at its end; only a program whose sum came out non-finite
(NaN/±inf in x, or overflow) re-reads its positions for exact finite-only partials (float64 squares).
Angle mode computes a tile's cos/sin once (BLOCK_D values, not each thread its own columns') into a
per-program slot (sketch_buffer.scratch) and reads them back after a barrier: the same tl.cos/tl.sin
of the same angles, so the same bits. H200 bf16, µs without / with the sketch, L2 flushed: 16384 x 32 x 128
108.7 / 113.5 -> 75.3 / 77.2, 65536 x 8 x 128 124.0 / 132.1 -> 81.5 / 95.6 (fewer heads, more tiles: the
trig was most of their loop), 4096 x 128 x 128 75.8 / 80.9 -> 74.8 / 80.1 (CUDA graphs 73.6 / 73.0 -> 71.2 /
71.6; bench/results/rope_trig*_h200_s31.md). Tiles of several positions for few heads ran slower
(16384 x 32 x 128: 78.4 / 96.0, rope_block_p_*_h200_s31.md).
Memory: read seq*heads*d (x) + seq positions, write seq*heads*d (+ 2*BLOCK_D floats a tile, L2); with the
sketch a few scalar atomics per program and the feature vector.
"""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from optwin.catalog import CATALOG, is_rope_base
from optwin.errors import InputError
from optwin.kernels._common import (
    MAX_BLOCK,
    cdiv,
    check_device,
    check_rows,
    device_name,
    finite_lanes,
    lane_max,
    lane_shape,
    lane_sum,
    last_program,
    next_pow2,
    persistent_grid,
    read_slot,
    register_cap,
    reset_workspace,
    sketch_sum_max,
    store_cast,
    store_common_features,
    tuned_on,
)
from optwin.kernels.launch_plan import Plan, kept, plan, run
from optwin.kernels.production import rope_inv_freq
from optwin.kernels.sketch_buffer import (
    WORKSPACE,
    feature_names,
    new_buffer,
    scratch,
    workspace,
)
from optwin.validation import check_kinds

BASE = float(CATALOG["rope"].params["base"])
assert feature_names("rope") == ("numel", "rows", "absmax", "rms", "nonfinite", "seq", "heads", "d", "max_pos", "base")
assert [n for n, _ in WORKSPACE["rope"][0]] == ["absmax", "sumsq", "max_pos"]
assert WORKSPACE["rope"][1] == ("ticket", "nonfinite")

_INV_CACHE: dict[tuple[int, float, str], torch.Tensor] = {}


@triton.jit
def _tile_x(X_ptr, tile, n_hb, n_seq, X_batch_stride, X_seq_stride, X_head_stride, hl, js, BLOCK_H: tl.constexpr):
    """Pointers to the first half of tile's x: (BLOCK_H, BLOCK_D), heads hl of its head block, columns js."""
    row = tl.cast(tile // n_hb, tl.int64)
    hs = (tile % n_hb) * BLOCK_H + hl
    return X_ptr + (row // n_seq) * X_batch_stride + (row % n_seq) * X_seq_stride + hs * X_head_stride + js


@triton.jit
def _tile_mask(tile, n_tiles, n_hb, n_heads, half, hl, js, BLOCK_H: tl.constexpr):
    """(BLOCK_H, BLOCK_D) mask of tile's elements: a tile that exists, its heads, its half's columns (the tile
    test broadcast through hl: the interpreter refuses a scalar leading a mask)."""
    return (tile + 0 * hl < n_tiles) & ((tile % n_hb) * BLOCK_H + hl < n_heads) & (js < half)


@triton.jit
def _tile_position(P_ptr, tile, n_hb, n_seq, P_batch_stride):
    """tile's position (int64), from the (batch, seq) positions."""
    row = tl.cast(tile // n_hb, tl.int64)
    return tl.load(P_ptr + (row // n_seq) * P_batch_stride + row % n_seq)


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
    T_ptr,  # float32 (grid * 4 * BLOCK_D,): each program's two slots of cos, sin (angle mode)
    C_ptr,  # cos table (batch, seq, d) in dtype (table mode)
    SN_ptr,  # sin table, same layout as cos (table mode)
    C_batch_stride,
    C_seq_stride,
    S_ptr,  # sketch features, float64 (10,); unused unless SKETCH
    F_ptr,  # workspace float64 slots (absmax, sumsq, max |position|)
    I_ptr,  # workspace int64 slots (ticket, nonfinite)
    n_rows,  # batch * seq
    n_seq,
    n_heads,
    n_hb,  # head blocks per position: cdiv(n_heads, BLOCK_H)
    half,  # d / 2
    base_bits,  # the rope base as float64 bits (int64), for the sketch
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,  # >= half
    FROM_TABLES: tl.constexpr,
    SKETCH: tl.constexpr,
    STAGES: tl.constexpr,  # loads in flight in the tile loop (1: none ahead; >1: async copies)
    VEC: tl.constexpr,  # elements per 16-byte vector of x
    LANES: tl.constexpr,  # lanes of the sketch accumulators (LANE_ACC; _common.lane_shape of the half tile)
    KEEP: tl.constexpr,  # independent accumulator chains per lane (divides VEC; _common's lane partials)
    LANE_ACC: tl.constexpr,  # sketch accumulators per lane ([LANES]) instead of per tile element
    FLUSH: tl.constexpr,  # tiles between float64 flushes of the lane sums of squares (LANE_ACC)
    AHEAD: tl.constexpr,  # the next tile's x loaded (into registers) before this tile's work
):
    pid = tl.program_id(0)
    hl = tl.arange(0, BLOCK_H)[:, None]  # (BLOCK_H, 1) head within the block
    js = tl.arange(0, BLOCK_D)[None, :]  # (1, BLOCK_D)
    n_tiles = n_rows * n_hb
    TILE: tl.constexpr = BLOCK_H * BLOCK_D
    if SKETCH:
        if LANE_ACC:  # one register per accumulator: the row-major half tile is REPS x LANES x VEC per thread
            v_amax = tl.zeros([LANES, KEEP], dtype=tl.float32)  # running max |x| per lane
            v_sq = tl.zeros([LANES, KEEP], dtype=tl.float32)  # running sum x^2 per lane, flushed every FLUSH tiles
            p_sq = tl.zeros((), dtype=tl.float64)
            n_left = tl.full((), FLUSH, tl.int32)
        else:
            v_amax = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)  # running max |x| per tile element
            v_sq = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)  # running sum x^2 per tile element
        p_pos = tl.zeros((), dtype=tl.int64)  # largest |position|
    n_done = tl.zeros((), dtype=tl.int32)  # tiles done: their parity picks the cos/sin slot
    if AHEAD:  # the first tile's x, loaded before the loop: each iteration loads the next one's
        mask_n = _tile_mask(pid, n_tiles, n_hb, n_heads, half, hl, js, BLOCK_H)
        xp_n = _tile_x(X_ptr, pid, n_hb, n_seq, X_batch_stride, X_seq_stride, X_head_stride, hl, js, BLOCK_H)
        x1_n = tl.load(xp_n, mask=mask_n, other=0.0, eviction_policy="evict_first")
        x2_n = tl.load(xp_n + half, mask=mask_n, other=0.0, eviction_policy="evict_first")
        if not FROM_TABLES:  # and its position: the trig of a tile waits on nothing loaded in that tile
            pos_n = _tile_position(P_ptr, tl.minimum(pid, n_tiles - 1), n_hb, n_seq, P_batch_stride)
    for tile in tl.range(pid, n_tiles, tl.num_programs(0), num_stages=STAGES):
        row = tl.cast(tile // n_hb, tl.int64)
        hs = (tile % n_hb) * BLOCK_H + hl  # (BLOCK_H, 1) heads of this tile
        mask = (hs < n_heads) & (js < half)  # (BLOCK_H, BLOCK_D)
        b = row // n_seq
        s = row % n_seq
        if AHEAD:
            # this tile's x arrived during the previous tile's work; the next tile's loads go out now,
            # so a program keeps one tile's reads in flight while it rotates and sketches (flushed L2,
            # 2 programs an SM: the loop waited on its own loads half the time, stop 26's counters)
            x1 = x1_n.to(tl.float32)
            x2 = x2_n.to(tl.float32)
            nxt = tile + tl.num_programs(0)
            mask_n = _tile_mask(nxt, n_tiles, n_hb, n_heads, half, hl, js, BLOCK_H)
            xp_n = _tile_x(X_ptr, nxt, n_hb, n_seq, X_batch_stride, X_seq_stride, X_head_stride, hl, js, BLOCK_H)
            x1_n = tl.load(xp_n, mask=mask_n, other=0.0, eviction_policy="evict_first")
            x2_n = tl.load(xp_n + half, mask=mask_n, other=0.0, eviction_policy="evict_first")
            if not FROM_TABLES:
                pos_ahead = pos_n
                pos_n = _tile_position(P_ptr, tl.minimum(nxt, n_tiles - 1), n_hb, n_seq, P_batch_stride)
        else:
            xp = _tile_x(X_ptr, tile, n_hb, n_seq, X_batch_stride, X_seq_stride, X_head_stride, hl, js, BLOCK_H)
            x1 = tl.load(xp, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)  # heads*d/2
            x2 = tl.load(xp + half, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        if SKETCH and LANE_ACC:  # before the rotation: x1, x2 live no longer than without the sketch
            a = tl.reshape(tl.maximum(tl.abs(x1), tl.abs(x2)), [TILE])
            q = tl.reshape(x1 * x1 + x2 * x2, [TILE])  # NaN/±inf make it non-finite: the exact path after the loop
            v_amax = tl.maximum(v_amax, lane_max(a, TILE, LANES, VEC, KEEP))
            v_sq += lane_sum(q, TILE, LANES, VEC, KEEP)
            n_left -= 1
            if n_left == 0:
                p_sq += tl.sum(v_sq).to(tl.float64)
                v_sq = tl.zeros([LANES, KEEP], dtype=tl.float32)
                n_left = FLUSH
        if FROM_TABLES:
            cp = b * C_batch_stride + s * C_seq_stride + js  # (1, BLOCK_D)
            jm = js < half
            c1 = tl.load(C_ptr + cp, mask=jm, other=0.0).to(tl.float32)  # read d (dtype), per position
            c2 = tl.load(C_ptr + cp + half, mask=jm, other=0.0).to(tl.float32)
            s1 = tl.load(SN_ptr + cp, mask=jm, other=0.0).to(tl.float32)
            s2 = tl.load(SN_ptr + cp + half, mask=jm, other=0.0).to(tl.float32)
        else:
            if AHEAD:
                pos_i = pos_ahead
            else:
                pos_i = tl.load(P_ptr + b * P_batch_stride + s)  # read 1 int64
            pos = pos_i.to(tl.float32)
            # cos/sin of the position's BLOCK_D angles, computed once a tile into this program's slot
            # and read back in the tile's layout: computed in it, each thread took the 8 columns of
            # its 16-byte vectors, 16 libdevice cos/sin (~30 instructions each) a thread and tile,
            # ~half the loop (offline sm_90a: loop 1791 -> 619 SASS). Two slots, alternating: the
            # next tile's writes come after the next barrier, so after every thread's reads of this one
            j1 = tl.arange(0, BLOCK_D)
            inv = tl.load(INV_ptr + j1, mask=j1 < half, other=0.0, eviction_policy="evict_last")  # d/2 fp32
            ang = pos * inv  # (BLOCK_D,) fp32
            slot = T_ptr + (pid * 2 + n_done % 2) * (2 * BLOCK_D)
            tl.store(slot + j1, tl.cos(ang))
            tl.store(slot + BLOCK_D + j1, tl.sin(ang))
            tl.debug_barrier()
            c1 = tl.load(slot + js)  # (1, BLOCK_D)
            s1 = tl.load(slot + BLOCK_D + js)
            n_done += 1
            c2 = c1
            s2 = s1
            if SKETCH:
                p_pos = tl.maximum(p_pos, tl.abs(pos_i.to(tl.int64)))
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
        yp = Y_ptr + b * Y_batch_stride + s * Y_seq_stride + hs * Y_head_stride + js
        tl.store(yp, store_cast(y1, Y_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first")  # heads*d/2
        tl.store(yp + half, store_cast(y2, Y_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first")
        if SKETCH and not LANE_ACC:  # elementwise only; NaN/±inf poison v_sq: the exact path after the loop
            v_amax = tl.maximum(v_amax, tl.maximum(tl.abs(x1), tl.abs(x2)))
            v_sq += x1 * x1 + x2 * x2
    if SKETCH:
        sq_total, p_amax = sketch_sum_max(v_sq, v_amax)
        if LANE_ACC:
            p_sq += sq_total.to(tl.float64)
        else:
            p_sq = sq_total.to(tl.float64)
        p_nf = tl.zeros((), dtype=tl.int64)
        if not (p_sq <= 1e308):  # rare: re-read this program's positions, exact finite-only partials
            p_sq = tl.zeros((), dtype=tl.float64)
            p_amax = tl.zeros((), dtype=tl.float32)
            for t2 in tl.range(pid, n_tiles, tl.num_programs(0)):
                mask2 = _tile_mask(t2, n_tiles, n_hb, n_heads, half, hl, js, BLOCK_H)
                xq = _tile_x(X_ptr, t2, n_hb, n_seq, X_batch_stride, X_seq_stride, X_head_stride, hl, js, BLOCK_H)
                for hf in tl.static_range(2):  # one half at a time: this path must not set the kernel's registers
                    z = tl.load(xq + hf * half, mask=mask2, other=0.0).to(tl.float32)
                    a1, _, n1 = finite_lanes(z, mask2)
                    a64 = a1.to(tl.float64)  # squares in float64: a finite x up to FMAX does not overflow them
                    p_amax = tl.maximum(p_amax, tl.max(a1))
                    p_sq += tl.sum(a64 * a64)
                    p_nf += tl.sum(n1).to(tl.int64)
        tl.atomic_max(F_ptr + 0, p_amax.to(tl.float64), sem="relaxed")
        tl.atomic_add(F_ptr + 1, p_sq, sem="relaxed")
        tl.atomic_max(F_ptr + 2, p_pos.to(tl.float64), sem="relaxed")
        tl.atomic_add(I_ptr + 1, p_nf, sem="relaxed")
        if last_program(I_ptr):
            g_amax = read_slot(F_ptr + 0)
            g_sq = read_slot(F_ptr + 1)
            g_pos = read_slot(F_ptr + 2)
            g_nf = read_slot(I_ptr + 1)
            reset_workspace(F_ptr, I_ptr)
            d = 2 * tl.cast(half, tl.int64)
            numel = tl.cast(n_rows, tl.int64) * n_heads * d
            store_common_features(S_ptr, numel, tl.cast(n_rows, tl.int64) * n_heads, g_amax, g_sq, numel - g_nf, g_nf)
            tl.store(S_ptr + 5, tl.cast(n_rows, tl.float64))  # batch * seq, as ingest flattens x
            tl.store(S_ptr + 6, tl.cast(n_heads, tl.float64))
            tl.store(S_ptr + 7, d.to(tl.float64))
            tl.store(S_ptr + 8, g_pos)
            tl.store(S_ptr + 9, tl.cast(tl.cast(base_bits, tl.int64), tl.float64, bitcast=True))



def _inv_freq(d: int, base: float, device: torch.device) -> torch.Tensor:
    """The spec's float32 inverse-frequency table, computed once per (d, base, device)."""
    key = (d, base, str(device))
    if key not in _INV_CACHE:
        _INV_CACHE[key] = rope_inv_freq(d, base, device)
    return _INV_CACHE[key]


def _check_4d(x: torch.Tensor) -> None:
    """x is (batch, seq, heads, d) with even, contiguous d (every call; the tile limit: _check_tile, once a plan)."""
    if x.ndim != 4 or x.shape[-1] % 2 or x.stride(-1) != 1:
        raise InputError(f"rope: x must be (batch, seq, heads, d) with even, contiguous d; got {tuple(x.shape)}")


def _check_tile(x: torch.Tensor) -> None:
    if x.shape[2] == 0 or x.shape[3] % 2:  # no heads; or no half to rotate against the other
        raise InputError(f"rope: x needs heads and an even head dim, got (batch, seq, heads, d) {tuple(x.shape)}")
    if next_pow2(x.shape[2]) * next_pow2(x.shape[3]) > MAX_BLOCK:
        raise InputError(f"rope: heads*d = {x.shape[2] * x.shape[3]} exceeds the single-program limit {MAX_BLOCK}")


# (BLOCK_H, num_warps, stages) per (next_pow2(heads), next_pow2(d/2), sketch), measured on the H200
# (bench/results/kernels_h200.md); others get rope_config's rule. y is elementwise, so the two
# sketch modes may use different launches. 2026-11-29 at 4096x128x128 bf16: without the sketch
# 16 warps 84.3 µs -> 8 warps 78.1; with it 16 warps stays best (90.9; 8 warps 91.2).
# Issue #6 (bench/results/sketch_lanes_h200_s11b.md): with lane accumulators the sketch runs at the
# no-sketch launch, 8 warps and 2 programs per SM: 79.0/85.0 µs (per-element accumulators at 16
# warps, 1 program per SM: 91.8).
# H100 (stop 47, bench/results/rope_tiles_h100_s47.md, three rounds): the sketched launch at 32 heads a tile and 4
# warps (per-element accumulators) against 128 heads, 8 warps and lane accumulators, µs L2 flushed / CUDA graph:
# 4096x128x128 bf16 102.0-102.7 / 94.4-94.5 against 101.7-102.6 / 100.6-101.1 (no sketch 99.1-99.6 / 96.0-96.2),
# fp16 102.0-102.8 / 94.4 against 101.8-102.2 / 101.2; 16384x32x128 bf16 102.0-102.1 / 93.7-93.8 against 100.3-100.8
# / 100.1-100.3 (no sketch 98.7-99.6 / 96.7-97.1), fp16 100.3-101.0 / 99.2-99.6 against 100.3-100.5 / 100.0-100.4.
# Back to back (serving's CUDA graphs) the sketched launch became faster than the one without the sketch.
# ROPE_TUNED stays the H200's: the tiles were not timed there.
ROPE_TUNED: dict[tuple[int, int, bool], tuple[int, int, int]] = {(128, 64, False): (128, 8, 1),
                                                                 (128, 64, True): (128, 8, 1)}
ROPE_TUNED_ON_DEVICE: dict[str, dict[tuple[int, int, bool], tuple[int, int, int]]] = {
    "H100": {(128, 64, True): (32, 4, 1), (32, 64, True): (32, 4, 1)},
}
# Sketch accumulators per lane ([LANES, KEEP] registers) instead of per tile element (2 x 16
# registers at 16 warps, 2 x 32 at 8), at the launches listed in ROPE_MAXNREG (measured); elsewhere
# per element, as before. KEEP sets the independent add/max chains per thread: one chain per lane
# (the first sweep, bench/results/sketch_lanes_h200_s11.md) was latency-bound at 16 warps (104.6 µs);
# at 8 warps KEEP 1/2/4/8 gave 85.3/85.0/85.5/86.7.
LANE_ACC = True
FLUSH = 16  # tiles between float64 flushes of the lane sums of squares
KEEP = 2
# Register cap of the lane-accumulator sketch kernel per (BLOCK_H, BLOCK_D, num_warps): ptxas gives it
# ~170 registers at 8 warps uncapped (1 program per SM, 114.0 µs); at 128 it keeps 2 programs per SM
# (offline sm_90 compile with triton 3.6: the same 32-byte sin/cos frame as without the sketch at KEEP 1).
ROPE_MAXNREG: dict[tuple[int, int, int], int] = {(128, 64, 8): 128}
# Load the next tile's x before this tile's work (the kernel's AHEAD; ahead= overrides it)
AHEAD = False


def rope_config(heads: int, d: int, sketch: bool, block_h: int | None = None, num_warps: int | None = None,
                stages: int | None = None, device: str = "") -> tuple[int, int, int, int]:
    """(BLOCK_H, BLOCK_D, num_warps, stages): ROPE_TUNED (after the GPU named `device`'s ROPE_TUNED_ON_DEVICE
    entries), else all heads in one tile with warps by tile size; the arguments override (the bench's sweep)."""
    full_h, block_d = next_pow2(heads), next_pow2(d // 2)
    tile = full_h * block_d * 2
    bh, w, st = tuned_on(device, ROPE_TUNED_ON_DEVICE, ROPE_TUNED, (full_h, block_d, sketch),
                         (full_h, 16 if tile >= 8192 else 8 if tile >= 2048 else 4, 1))
    bh = min(block_h or bh, full_h)
    return bh, block_d, num_warps or w, stages or st


def _rope_launch(
    x4: torch.Tensor,  # (batch, seq, heads, d) view
    y4: torch.Tensor,  # (batch, seq, heads, d) view
    buf: torch.Tensor | None,
    positions: torch.Tensor | None = None,  # (batch, seq) int64, angle mode
    inv: torch.Tensor | None = None,  # (d/2,) fp32, angle mode
    cos: torch.Tensor | None = None,  # (batch, seq, d), table mode
    sin: torch.Tensor | None = None,
    base: float = 0.0,  # reported in the sketch only
    block_h: int | None = None,
    num_warps: int | None = None,
    stages: int | None = None,
    per_sm: int | None = None,
    lane_acc: bool | None = None,
    maxnreg: int | None = None,
    keep: int | None = None,
    ahead: bool | None = None,
) -> None:
    """Grid: one persistent program per resident slot (persistent_grid), each over its tiles.
    block_h / num_warps / stages / per_sm / lane_acc / maxnreg (0: none) / keep override the tuned launch
    (the bench's sweep). The launch is worked out once per key (launch_plan)."""
    _check_4d(x4)
    batch, seq, heads, d = x4.shape
    if batch * seq == 0 and buf is None:
        return
    tables = cos is not None
    sketch = buf is not None
    xs, ys = x4.stride(), y4.stride()
    # angle mode: positions' row stride; table mode: the tables' (batch, seq) strides
    ts = cos.stride() if tables else positions.stride(0)
    key = ("rope", x4.shape, xs, ys, x4.dtype, y4.dtype, x4.device, sketch,
           (ts, cos.dtype, sin.stride(), sin.dtype) if tables else (ts, positions.dtype, inv.dtype),
           base, block_h, num_warps, stages, per_sm, lane_acc, maxnreg, keep, ahead)
    p = kept(key) or _rope_plan(x4, sketch, tables, base, block_h, num_warps, stages, per_sm, lane_acc, maxnreg, keep,
                                ahead)
    n_hb, trig_slots, base_bits = p.extra
    dummy = y4
    f, i = workspace("rope", x4.device) if sketch else (dummy, dummy)
    if tables:
        angles = (dummy, 0, dummy, dummy, cos, sin, ts[0], ts[1])
    else:
        angles = (positions, ts, inv, scratch("rope-trig", x4.device, trig_slots), dummy, dummy, 0, 0)
    run(key, p, (x4, xs[0], xs[1], xs[2], y4, ys[0], ys[1], ys[2], *angles, buf if sketch else dummy, f, i,
                 batch * seq, seq, heads, n_hb, d // 2, base_bits))


def _rope_plan(x4: torch.Tensor, sketch: bool, tables: bool, base: float, block_h: int | None,
               num_warps: int | None, stages: int | None, per_sm: int | None, lane_acc: bool | None,
               maxnreg: int | None, keep: int | None, ahead: bool | None = None) -> Plan:
    """_rope_launch's grid and options for this call's shape, dtype, mode and overrides; extra: (head
    blocks, the trig scratch's floats, base's float64 bits)."""
    _check_tile(x4)
    batch, seq, heads, d = x4.shape
    block_h, block_d, warps, st = rope_config(heads, d, sketch, block_h, num_warps, stages, device_name(x4.device))
    n_hb = cdiv(heads, block_h)
    measured = (block_h, block_d, warps) in ROPE_MAXNREG
    lacc = (LANE_ACC and measured if lane_acc is None else lane_acc) and sketch
    vec, lanes = lane_shape(block_h * block_d, x4.element_size(), warps)
    kp = min(KEEP if keep is None else keep, vec) if lacc else 1
    cap = (ROPE_MAXNREG.get((block_h, block_d, warps)) if maxnreg is None else maxnreg) if lacc else None
    # no tiles (an empty x, launched for its sketch): no first tile to load ahead, nor a position to divide by
    ah = (AHEAD if ahead is None else bool(ahead)) and batch * seq > 0
    key = ("rope", x4.dtype, block_h, block_d, warps, st, tables, sketch, lacc, cap, kp, ah)
    base_bits = struct.unpack("<q", struct.pack("<d", float(base)))[0]
    grid = persistent_grid(key, batch * seq * n_hb, x4.device, per_sm)
    return plan(_rope_kernel, (grid,),
                {"BLOCK_H": block_h, "BLOCK_D": block_d, "FROM_TABLES": tables, "SKETCH": sketch, "STAGES": st,
                 "VEC": vec, "LANES": lanes, "KEEP": kp, "LANE_ACC": lacc, "FLUSH": FLUSH, "AHEAD": ah, "num_warps": warps,
                 **register_cap(cap)}, key, warps, (n_hb, grid * 4 * block_d, base_bits))


def rope(
    x: torch.Tensor, positions: torch.Tensor, base: float = BASE, sketch: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(x rotated by positions, sketch buffer or None) for x (seq, heads, d), positions (seq,) ints.

    Read the buffer with optwin.kernels.read_sketch("rope", buf, x.shape, {"base": base}).
    """
    check_device(x, positions)
    check_rows("rope", x)
    if x.ndim != 3 or positions.shape != x.shape[:1]:
        raise InputError(f"rope: x must be (seq, heads, d) and positions (seq,); got {tuple(x.shape)}, {tuple(positions.shape)}")
    check_kinds(CATALOG["rope"], {"x": x, "positions": positions})  # float positions would be truncated
    if not is_rope_base(base):
        raise InputError(f"rope: base must be a finite number > 1, got {base!r}")
    x4 = x.unsqueeze(0)  # (1, seq, heads, d)
    if x4.stride(-1) != 1:
        x4 = x4.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # (seq, heads, d)
    buf = new_buffer("rope", x.device) if sketch else None
    pos = positions.to(torch.int64).contiguous().unsqueeze(0)  # (1, seq)
    _rope_launch(x4, y.unsqueeze(0), buf, positions=pos, inv=_inv_freq(x.shape[-1], float(base), x.device),
                 base=float(base))
    return y, buf


def rope_from_tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     sketch: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y, sketch buffer or None): y = x*cos + rotate_half(x)*sin for HF layouts: x (batch, heads, seq,
    d), cos/sin (batch|1, seq, d).

    fp32 inside, one rounding to x's dtype (HF eager rounds each product to dtype). The sketch covers
    x (absmax, rms, nonfinite, shapes, with seq = batch * seq as optwin.ingest flattens it); the
    tables carry no positions, so max_pos and base read 0: the caller that knows them fills them in
    (optwin.monitor does, from the rotary module).
    """
    check_device(x, cos, sin)
    check_rows("rope", x)
    if (x.ndim != 4 or cos.ndim != 3 or cos.shape != sin.shape or cos.shape[0] not in (1, x.shape[0])
            or tuple(cos.shape[1:]) != (x.shape[2], x.shape[3])):
        raise InputError(f"rope: x must be (batch, heads, seq, d) and cos, sin (batch or 1, seq, d); got "
                         f"{tuple(x.shape)}, {tuple(cos.shape)}, {tuple(sin.shape)}")
    x4 = x.transpose(1, 2)  # (batch, seq, heads, d) view, no copy
    if x4.stride(-1) != 1:
        x4 = x4.contiguous()
    y = torch.empty_like(x, memory_format=torch.contiguous_format)  # (batch, heads, seq, d)
    cos = cos.expand(x.shape[0], -1, -1) if cos.shape[0] == 1 else cos  # stride 0 over batch
    sin = sin.expand(x.shape[0], -1, -1) if sin.shape[0] == 1 else sin
    if cos.stride(-1) != 1 or cos.stride() != sin.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    buf = new_buffer("rope", x.device) if sketch else None
    _rope_launch(x4, y.transpose(1, 2), buf, cos=cos, sin=sin)
    return y, buf
