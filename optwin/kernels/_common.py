"""Triton helpers shared by the kernels: launch settings, the persistent grid, the finite-only sketch
partials and the in-kernel sketch reduction (atomics into a workspace, finalized by the last program;
or, for launches with a program per row, row records polled by a finisher program).

    python -c "import optwin.kernels._common as c; print(c.launch_settings(16384))"

Imports triton: only the kernel modules import this one.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from optwin.errors import InputError
from optwin.kernels.sketch_buffer import SLOTS
from optwin.twin.numerics import LOG2E_F32 as TWIN_LOG2E_F32
from optwin.twin.numerics import TRITON_WHOLE_ROW_MAX

# Largest row a single program holds in registers (BLOCK >= n, next power of two). The norms read
# longer rows in TRITON_CHUNK pieces; both numbers are part of their numerics, so the twin owns them.
MAX_BLOCK = TRITON_WHOLE_ROW_MAX

# Under TRITON_INTERPRET=1 (CPU tests) the kernels use one tl.max/tl.sum per partial instead of a
# combined multi-operand tl.reduce: same values (same reduction per partial), numpy-fast.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
INTERPRET: tl.constexpr = tl.constexpr(INTERPRETED)


def register_cap(cap: int | None) -> dict[str, int]:
    """The launch option capping registers per thread, or none: the interpreter takes no maxnreg
    (bench/offline_compile.py compiles with it on a machine without a GPU)."""
    return {"maxnreg": cap} if cap and not INTERPRETED else {}

WS_SLOTS: tl.constexpr = tl.constexpr(SLOTS)  # slots of each kind per workspace (sketch_buffer)

# Largest finite float32; |h| <= FMAX is false for NaN and ±inf, so it is the finiteness test.
FMAX: tl.constexpr = tl.constexpr(3.4028234663852886e38)

# Resident programs per SM of each compiled kernel (from its register count), filled after the
# first launch; a kernel not seen yet gets DEFAULT_OCCUPANCY.
DEFAULT_OCCUPANCY = 2
_OCCUPANCY: dict[tuple[Any, ...], int] = {}
_SMS: dict[int, int] = {}


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 2  # interpreter: a couple of programs, so the cross-program merge is exercised
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def persistent_grid(key: tuple[Any, ...], n_rows: int, device: torch.device, per_sm: int | None = None) -> int:
    """Programs of a persistent kernel: as many as fit on the GPU at once (each walks rows
    pid, pid + grid, ...), so every program starts immediately and merges its sketch once; >= 1.
    `per_sm` overrides the recorded occupancy (the bench's sweep; a large value gives one program
    per row)."""
    return max(1, min(n_rows, resident_programs(key, device, per_sm)))


def resident_programs(key: tuple[Any, ...], device: torch.device, per_sm: int | None = None) -> int:
    """Programs of the launch `key` resident on the whole GPU at once (the recorded occupancy)."""
    return (per_sm or _OCCUPANCY.get(key, DEFAULT_OCCUPANCY)) * _sms(device)


def grid_per_sm(op: str, block: int, sketch: bool, per_sm: int | None = None) -> int | None:
    """persistent_grid's per_sm for a launch: the caller's (the bench's sweep), else ROW_GRID's one
    program per row for the launches without the sketch it lists, else None (the occupancy)."""
    if per_sm is not None:
        return per_sm
    return ROW_PER_PROGRAM if not sketch and (op, block) in ROW_GRID else None


def note_occupancy(key: tuple[Any, ...], compiled: Any, num_warps: int) -> None:
    """Record how many programs of `compiled` fit on one SM: registers (rounded to 8 per thread),
    warps (64 per SM) and shared memory (228 KiB on Hopper). DEFAULT_OCCUPANCY where Triton gives no
    counts (the interpreter), so the launch's plan is final either way (launch_plan)."""
    if key in _OCCUPANCY:
        return
    try:
        regs = int(compiled.n_regs)
        shared = int(getattr(compiled, "metadata", None).shared or 0) if hasattr(compiled, "metadata") else 0
    except Exception:  # noqa: BLE001 - interpreter / other backends
        regs = 0
    if regs <= 0:
        _OCCUPANCY[key] = DEFAULT_OCCUPANCY
        return
    by_regs = 65536 // (((regs + 7) // 8) * 8 * 32 * num_warps)
    by_warps = 64 // num_warps
    by_smem = (228 * 1024) // shared if shared else 32
    _OCCUPANCY[key] = max(1, min(by_regs, by_warps, by_smem, 32))


def occupancy_table() -> dict[tuple[Any, ...], int]:
    """Programs per SM recorded so far (the bench reports them)."""
    return dict(_OCCUPANCY)


def next_pow2(n: int) -> int:
    """triton.next_power_of_2 on the host (0 stays 0): the same values without its constexpr-function
    wrapper, ~3 µs a call on the CI machine, several of which every launch paid (bench/launch_cost.py --host)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def cdiv(a: int, b: int) -> int:
    """triton.cdiv on the host, without its wrapper (~5 µs a call on the CI machine)."""
    return -(-a // b)


def launch_settings(n: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for a row of n elements: one row per program, BLOCK = next_pow2(n).

    Warps grow with the block so each thread holds at most ~16-64 elements (Liger-Kernel's table).
    num_warps fixes the per-thread chunk of each tl.sum tree, so it is part of the numerics.
    """
    block = next_pow2(max(int(n), 1))
    if block > MAX_BLOCK:
        raise InputError(f"row length {n} exceeds the single-program limit {MAX_BLOCK}")
    warps = 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4
    return block, warps


# Measured overrides of launch_settings per (op, BLOCK): (num_warps, loop stages), chosen from the
# H200 sweep in bench/gpu_kernels.py (bench/results/kernels_h200.md). num_warps changes the tl.sum
# tree (the twins model a tree, not its exact shape); stages only changes how far loads run ahead.
TUNED: dict[tuple[str, int], tuple[int, int]] = {
    # rmsnorm: with the sketch's max tree, 16 warps need > 64 registers a thread (1 program per SM,
    # +25% on the H200); 8 warps fit both variants in 128 (2 per SM)
    ("rmsnorm", 8192): (8, 1),
    # sweep of 2026-11-29 at 4096x16384 bf16 (µs without / with the sketch): rmsnorm 8 warps
    # 81.2/84.2 -> 2 stages 75.7/79.9; layernorm 16 warps 84.0/127.8 -> 8 warps 2 stages
    # 79.0/123.2; softmax 16 warps 81.4/182.7 -> 32 warps 81.7/144.2. The second run's sweep:
    # layernorm 4 warps, 2 stages, exact pass after the loop 80.6/90.2 (8 warps 80.0/123.8)
    ("rmsnorm", 16384): (8, 2),
    ("layernorm", 16384): (8, 1),  # with REG_CAP below; the sketched launch: SKETCH_STAGES
    # rows past MAX_BLOCK, read in TRITON_CHUNK pieces (4096): the best chunked launches of the H200
    # sweep at 4096x16384 bf16 (bench/results/norm_chunks_h200_s12.md), still slower than a row held
    # in registers where one fits: rmsnorm 16 warps 77.5/96.8 µs, layernorm 8 warps 95.2/102.9
    ("rmsnorm-chunked", 4096): (16, 1),
    ("layernorm-chunked", 4096): (8, 1),
    # softmax rows past MAX_BLOCK, a program per (row, 4096-wide piece) (softmax_long), H200, µs without /
    # with the sketch at 8 -> 4 warps: bf16 256x128256 60.1 / 92.4 -> 58.3 / 80.8 (CUDA graphs 55.4 / 87.4 ->
    # 54.1 / 77.1), float32 105.6 / 122.4 -> 106.8 / 115.1, bf16 8x128256 (graphs) 4.5 / 7.9 -> 4.6 / 7.5
    # (bench/results/long_*_h200_s24c.md; 8192-wide pieces no better)
    ("softmax-pieces", 4096): (4, 1),
}

# TUNED per (op, BLOCK, element bytes) where an element size was measured apart (float32 against the
# 16-bit rows TUNED was swept with; softmax's 16-bit rows against float32's); these win over TUNED.
# float32 rows hold twice the registers: H200, 4096x16384 float32, 3 interleaved rounds, µs without /
# with the sketch (bench/results/fp32_sweep_h200_s23.md): softmax 16 warps 172.2 / 495.0 (the sketch
# capped at 64 registers spills 736 bytes) -> 32 warps one row ahead 146.8 / 183.2 (torch.compile
# 155.7); rmsnorm 8 warps 2 stages 153.2 / 147.5 (1 program per SM) -> 1 stage one wave ahead 137.6 /
# 139.7 (torch.compile 131.4; 16 warps half a wave ahead 132.4 / 148.6). Both launches keep the same
# warps: they set the tl.sum trees, so y is the same with and without the sketch.
TUNED_BY_ELEMENT: dict[tuple[str, int, int], tuple[int, int]] = {
    # softmax: 16 warps once the NaN/inf recompute went to 256-column pieces (bench/softmax_sketch.py):
    # the sketch fits 64 registers (2 programs per SM), 121.7 µs vs 144.2 at 32 warps; no sketch 82.1 vs 81.1.
    # Layout 4 (lane accumulators, capped at 64 registers: softmax.MAXNREG) 82.2/115.8 (8 warps at 128
    # registers 89.2/135.8; bench/results/softmax_sketch_h200_s11*.md)
    # Stop 32: 64 elements a thread (BLOCK // 2048 warps, at least 2) for 16-bit rows. Fewer warps a row
    # mean fewer warps in each tree's cross-warp exchange; the sketched launch (layout 10) gained most.
    # H200 bf16, µs without / with the sketch, L2 flushed, 5 interleaved rounds, old -> new warps
    # (bench/results/softmax_w*_h200_s32.md): 4096x16384 16 -> 8 (capped at 128 registers: MAXNREG)
    # 70.2 / 80.7 -> 70.1 / 77.4, HF-masked 71.0 / 89.2 -> 69.5 / 83.3, float16 70.0 / 82.6 -> 69.8 / 78.0,
    # CUDA graphs 66.8 / 77.4 -> 66.9 / 74.0; 8192x8192 16 -> 4: 76.5 / 91.9 -> 73.0 / 76.2 (HF-masked
    # 76.3 / 103.9 -> 72.7 / 77.8); 16384x4096 8 -> 2: 77.7 / 92.9 -> 76.4 / 81.2; 32768x2048 8 -> 2:
    # 77.7 / 132.9 -> 77.5 / 82.6 (4 warps 73.0 / 87.9, 1 warp 79.7 / 79.2); 2048x32768 32 -> 16:
    # 82.4 / 92.9 -> 80.8 / 90.2. Before stop 21's word layout, 8 warps had lost at 16384 (layout 4,
    # 89.2 / 135.8 against 82.2 / 115.8). float32 rows keep launch_settings' warps but at 16384.
    # Stop 34: rows of 32769-65535 (BLOCK 65536; a vocabulary like GPT-2's 50257) take 16 warps, not 32:
    # 128 elements a thread at 1 program per SM. Both spill (offline sm_90a at 512x50256: 32 warps 64 registers,
    # 212 / 316 bytes; 16 warps 128, 264 / 424), but 32 warps' trees cross twice the warps. H200 bf16, µs
    # without / with the sketch, 32 -> 16 warps (bench/results/softmax_65536_warps_h200_s34.md): 512x50257
    # 54.6 / 93.1 -> 52.5 / 67.7, 512x50256 58.8 / 60.6 -> 50.7 / 59.1, 1024x40000 98.4 / 96.4 -> 82.4 / 95.0,
    # 2048x32769 167.7 / 271.2 -> 142.1 / 177.9 (softmax_long's 4096-wide pieces: 58.5 / 116.5, 46.4 / 61.6,
    # 66.1 / 91.1, 131.7 / 287.7; bench/results/softmax_65536_pieces_h200_s34.md).
    **{("softmax", b, 2): (w, 1) for b, w in ((2048, 2), (4096, 2), (8192, 4), (16384, 8), (32768, 16),
                                               (65536, 16))},
    ("softmax", 16384, 4): (32, 1),
    ("rmsnorm", 16384, 4): (8, 1),
}


# Register caps (maxnreg) per (op, BLOCK) at the tuned num_warps. H200, 4096x16384 bf16, interleaved
# rounds, µs without / with the sketch: layernorm 4 warps 2 stages 80.1/90.1 (stop 12's launch); 8
# warps capped at 128 registers (2 programs per SM instead of 1) 78.8/95.7 at 2 stages, 80.4/85.2 at
# 1 (norm_chunks_h200_s13.md); with the parameters' partials moved from program 0 to the last
# program, 79.3/82.0 at 2 stages (norm_chunks_h200_s13f.md). The sketched launch keeps the same
# warps (they set the tl.sum trees).
REG_CAP: dict[tuple[str, int], int] = {("layernorm", 16384): 128}

# Launches without the sketch that run one program per row, per (op, BLOCK): the hardware hands each
# row to the SM that frees up first, where a persistent program's static share (rows pid, pid + grid,
# ...) leaves the programs that met slow memory finishing last. H200, 4096x16384 bf16, µs persistent
# -> a program per row: rmsnorm 73.4 -> 72.0, layernorm 80.1 -> 76.9, softmax 80.5 -> 77.0
# (bench/results/norm_chunks_h200_s15d.md). rmsnorm runs both launches in its own one-row kernel
# (_rmsnorm_rows_kernel: no row loop; 69.9 µs without the sketch, torch.compile 70.5), the sketched
# one with row records (see below), as softmax's at softmax.ROWS_BLOCKS (stop 35) and layernorm's Welford
# launch. The other sketched launches stay persistent: a program per row
# costs them +23 to +74 % with a merge and a ticket per program, and persistent programs that claim
# rows one at a time were slower than the static share (rmsnorm 77.6 against 75.2 µs,
# norm_chunks_h200_s15e.md; the code is in git history, commit 52b2a7d).
# rmsnorm a program per row at the widths of 7B-70B models too, bf16 at 128 MB, µs with L2 flushed /
# CUDA graph (bench/results/timing_modes_h200_s18c.md, _s18d.md): 16384x4096 72.6 / 65.3 against the
# persistent launch's 76.8 / 71.9 (torch.compile 76.8 / 73.5), sketched 79.6 / 74.6 against 82.0 /
# 76.3; 8192x8192 71.7 / 64.9 against 76.4 / 72.0 (torch.compile 67.6 / 65.0: faster with L2
# flushed), sketched 73.2 / 65.7 against 78.7 / 70.6. Not at 2048: 1 % without the sketch, and the
# sketched launch's finisher falls behind rows that short (104.3 against 92.1 µs at 32768x2048).
ROW_GRID: set[tuple[str, int]] = {("rmsnorm", 4096), ("rmsnorm", 8192), ("rmsnorm", 16384), ("layernorm", 16384),
                                  ("softmax", 16384)}
ROW_PER_PROGRAM = 1 << 20  # per_sm that makes persistent_grid give one program per row

# L2 prefetch (prefetch_row): rows ahead per (op, BLOCK, element bytes, sketch); absent: none.
# softmax, one row ahead, on the H200 with 16-bit rows, µs without / with the sketch, no prefetch ->
# prefetch (bench/results/softmax_prefetch_h200_s22*.md, L2 flushed, the same interleaved rounds):
#   4096x16384 bf16 73.1 / 86.9 -> 70.4 / 81.8; HF-masked 73.5 / 96.5 -> 70.1 / 89.7; CUDA graphs
#   69.0 / 81.2 -> 67.3 / 77.8; fp16 73.0 / 87.6 -> 70.2 / 83.9; 8192x8192 76.7 / 107.1 -> 75.6 / 91.3;
#   2048x32768 94.1 / 109.7 -> 82.2 / 95.0.
#   Not at BLOCK 4096 (16384x4096: 76.8 / 96.6 -> 85.7 / 109.6); two or four rows ahead lost at
#   4096x16384 (80.7 / 89.2 and 89.5 / 98.4). float32 rows: at TUNED_BY_ELEMENT's launches, below.
# rmsnorm and layernorm (the Welford kernel; its key holds the row length) with the sketch, a program per
# row and a finisher: one wave of programs ahead, bf16, µs with the sketch, no prefetch -> prefetch (the
# launch without the sketch, no prefetch; bench/results/norms_prefetch_h200_s22c_*.md):
#   rmsnorm   4096x16384 73.1 -> 71.6 (69.4), 8192x8192 74.2 -> 71.4 (71.8), 16384x4096 80.0 -> 72.7 (72.7)
#   layernorm 4096x16384 79.2 -> 77.2 (71.1), 8192x8192 77.4 -> 75.4 (69.7), 16384x4096 89.8 -> 77.5 (69.2)
# Their launches without the sketch lost with a wave ahead (rmsnorm 69.4 -> 84.7 at 4096x16384, layernorm
# 69-71 -> 93-96 at all three): they keep more programs per SM, so a wave ahead is more rows in flight in
# the L2. A fraction of a wave (bench/results/prefetch_fraction_h200_s22d_*.md): rmsnorm at 16384x4096
# 73.1 -> 69.5 at half a wave (4096x16384: 70.1 -> 70.0, not taken); layernorm lost at 1/4 and 1/2 (69.3
# -> 71.3, 75.9 at 16384x4096); with the sketch a wave stayed best or equal.
# Layernorm's sketched Welford launch at 8192 half a wave ahead too (stop 39, µs with the sketch, 5 rounds, a
# wave -> half: bf16 8192x8192 79.1 -> 74.5 (none 75.9, two waves 96.0; without the sketch 70.3), fp16 79.3 ->
# 72.9; bench/results/ln_pf_*8192x8192_h200_s39.md). Not 4096, where the dtypes disagreed: bf16 16384x4096 76.0 ->
# 73.9, fp16 91.8 -> 106.8 (a noisy run: torch.compile read 92-194 µs in its rounds; ln_pf_*16384x4096_h200_s39.md).
# Layernorm at 16384 half a wave ahead, not a wave (stop 30, 4096x16384, µs with the sketch, a wave -> none;
# the plain launch 70.3-71.5): float16 84.7 -> 73.7, bfloat16 76.5 -> 76.5 (bench/results/ln_dtype2_*_h200_s30.md).
# Stop 31, none -> half a wave: bfloat16 76.8 -> 75.9 and 76.5 -> 75.3, float16 73.9 -> 73.2 (a quarter 72.9;
# ln_bf16_h200_s31.md, ln_pf_*_h200_s31.md). Where a wave stays it still pays in float16: 16384x4096 81.3 ->
# 75.4, 8192x8192 76.0 -> 74.6 (ln_pf_*_h200_s30.md).
PREFETCH: dict[tuple[str, int, int, bool], float] = {
    **{("softmax", b, 2, sk): 1 for b in (8192, 16384, 32768) for sk in (False, True)},
    **{(op, b, 2, True): 1 for op, b in (("rmsnorm", 4096), ("rmsnorm", 8192), ("rmsnorm", 16384),
                                          ("layernorm", 4096))},
    **{("layernorm", b, 2, True): 0.5 for b in (8192, 16384)},
    ("rmsnorm", 4096, 2, False): 0.5,
    # float32 rows, one step ahead, µs without / with the sketch, none -> prefetch: 4096x16384 at
    # TUNED_BY_ELEMENT's launches (above; bench/results/fp32_defaults_h200_s23.md), 8192x8192 softmax
    # 149.9 / 210.1 -> 144.2 / 166.2, rmsnorm 145.5 / 145.1 -> 137.2 / 137.0 (fp32_8192x8192_h200_s23.md).
    # Not layernorm (4096x16384 139.7 -> 171.3, 8192x8192 137.2 -> 187.8, 2048x32768 163.1 -> 212.2), nor
    # BLOCK 32768 (softmax 170.0 / 496.7 -> 162.3 / 554.4: the sketch spills at 32 warps; rmsnorm no gain).
    **{(op, b, 4, sk): 1 for op in ("softmax", "rmsnorm") for b in (8192, 16384) for sk in (False, True)},
}

# Where a GPU's own timings disagree with PREFETCH (tuned on the H200): its name's part -> entries that replace
# PREFETCH's on it. H100 80GB HBM3 (2.86 TB/s copy; stop 47, bench/results/ln_prefetch_h100_s47.md): layernorm's
# sketched Welford launch, µs L2 flushed / CUDA graph with the sketch, the table's depth -> none (without the sketch):
#   4096x16384 bf16 96.1 / 93.4 -> 96.2-97.0 / 93.6-93.7 (95.9 / 93.0), fp16 100.1-100.7 / 97.3-97.5 -> 96.0-96.2 /
#   93.3-93.4 (95.2 / 92.4); 8192x8192 bf16 97.9 / 95.0 -> 96.0 / 93.0 (94.6 / 91.8), fp16 97.5 / 94.9 -> 95.2 / 92.8;
#   16384x4096 bf16 106.7 / 103.8 -> 95.9 / 92.6 (95.4 / 92.0), fp16 110.5 / 106.4 -> 96.1 / 92.9 (95.4 / 92.9).
# A quarter wave lost too (4096x16384 fp16 96.3 / 93.8), and at 2048x32768, which has none, 114.9 -> 132.3.
PREFETCH_ON_DEVICE: dict[str, dict[tuple[str, int, int, bool], float]] = {
    "H100": {("layernorm", b, 2, True): 0 for b in (4096, 8192, 16384)},
}
_DEVICE_NAMES: dict[int, str] = {}


def prefetch_depth(op: str, block: int, x2: torch.Tensor, sketch: bool) -> float:
    """PREFETCH's depth for the launch (op, BLOCK, x2's element size, sketch) on x2's GPU, after that GPU's
    PREFETCH_ON_DEVICE entries; 0 off the GPU's table."""
    return depth_on(device_name(x2.device), (op, block, x2.element_size(), sketch))


def depth_on(name: str, key: tuple[str, int, int, bool]) -> float:
    """The prefetch depth of the launch key on the GPU named `name` ("" off the GPU)."""
    return tuned_on(name, PREFETCH_ON_DEVICE, PREFETCH, key, 0)


def tuned_on(name: str, per_device: dict[str, dict[Any, Any]], table: dict[Any, Any], key: Any, default: Any) -> Any:
    """A tuning table's entry for key on the GPU named `name`: the entry of the first per_device table whose
    name part is in `name`, else table's, else default."""
    for part, own in per_device.items():
        if part in name and key in own:
            return own[key]
    return table.get(key, default)


def device_name(device: torch.device) -> str:
    """The CUDA device's name (cached; "" off the GPU): the tuning tables' per-device entries are keyed by it."""
    if device.type != "cuda":
        return ""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _DEVICE_NAMES:
        _DEVICE_NAMES[idx] = torch.cuda.get_device_name(idx)
    return _DEVICE_NAMES[idx]


# Loop stages of the sketched launch where they differ from TUNED's (stages only change how far loads
# run ahead, never y). layernorm with the FMA-folded variance and FMA epilogue (stop 14), H200 at
# 4096x16384 bf16, µs without / with the sketch: 2 stages 86.4 / 79.7, 1 stage 79.6 / 84.8
# (bench/results/norm_chunks_h200_s14e.md).
SKETCH_STAGES: dict[tuple[str, int], int] = {("layernorm", 16384): 2}

# Loop stages of the sketched launches with row records (a program per row), per (op, BLOCK).
# rmsnorm, H200 bf16 4096x16384, µs at 2 / 1 stage timed four ways (bench/results/timing_modes_h200_s18.md):
# L2 flushed before each launch 72.5 / 73.4, back to back 70.6 / 67.6, CUDA graph 68.8 / 66.8 (without
# the sketch: 69.9, 68.4, 66.8). One stage: serving runs launches back to back, from CUDA graphs.
RECORD_STAGES: dict[tuple[str, int], int] = {("rmsnorm", 16384): 1}  # 4096, 8192: 1 by default (TUNED has none)


class Launch(NamedTuple):
    """A row kernel's launch: BLOCK, num_warps, loop stages and register cap."""

    block: int
    warps: int
    stages: int
    maxnreg: int | None  # registers per thread; None: the compiler's choice


def launch_config(op: str, n: int, num_warps: int | None = None, stages: int | None = None,
                  chunk: int | None = None, maxnreg: int | None = None, sketch: bool = False,
                  esize: int = 2) -> Launch:
    """(BLOCK, num_warps, stages, maxnreg) for `op` over rows of n elements of esize bytes:
    launch_settings, then TUNED_BY_ELEMENT or TUNED, SKETCH_STAGES (a sketched launch) and REG_CAP,
    then the caller's overrides (the bench's sweep; maxnreg=0: no cap). A kernel that reads rows in
    pieces passes its `chunk`: BLOCK is then the chunk (any row length). A register cap applies only
    at the warps it was measured with."""
    block, warps = launch_settings(chunk or n)
    tuned_warps, st = TUNED_BY_ELEMENT.get((op, block, esize)) or TUNED.get((op, block), (warps, 1))
    if sketch:
        st = SKETCH_STAGES.get((op, block), st)
    warps = num_warps or tuned_warps
    cap = REG_CAP.get((op, block)) if warps == tuned_warps else None
    return Launch(block, warps, stages or st, (cap if maxnreg is None else maxnreg) or None)


def column_multiple(*counts: int) -> int:
    """The largest power of two up to 16 that divides every count (a row length, row strides, in elements):
    a kernel's ALIGN, which it declares with aligned() so that its row loads stay 16-byte vectors.
    Triton specializes an integer argument only when 16 divides it; a row of 9000 bf16 (18000 bytes, as
    16-byte aligned as one of 9008) otherwise compiled to element-wise loads: offline (sm_90a) the sketched
    softmax spilled 816 bytes and the plain one took 128 registers against 63 at 9008 (stop 29)."""
    bits = 0
    for c in counts:
        bits |= int(c)  # the lowest set bit of the OR is the largest power of two dividing them all (0s: none)
    return 16 if bits == 0 else min(16, bits & -bits)


@triton.jit
def aligned(v, ALIGN: tl.constexpr):
    """v (a multiple of ALIGN: column_multiple) as Triton's alignment analysis can see it. Not
    tl.multiple_of: on a kernel argument (no op to attach it to) the hint was dropped (no effect in the
    TTIR); v // ALIGN * ALIGN is v itself, and its product tells the analysis ALIGN divides it. At 16
    Triton's launch has specialized v already (16 divides it)."""
    if ALIGN > 1 and ALIGN < 16:
        return v // ALIGN * ALIGN
    else:
        return v


@triton.jit
def aligned_rows(n_cols, X_row_stride, Y_row_stride, ALIGN: tl.constexpr):
    """aligned() of a row kernel's row length and both row strides (column_multiple's ALIGN divides each)."""
    return aligned(n_cols, ALIGN), aligned(X_row_stride, ALIGN), aligned(Y_row_stride, ALIGN)


def check_device(*tensors: torch.Tensor) -> None:
    """Kernels run on CUDA, or on CPU under TRITON_INTERPRET=1 (tests)."""
    for t in tensors:
        if t.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise InputError(f"Triton kernels need CUDA tensors (or TRITON_INTERPRET=1), got a {t.device} tensor")


# dtypes of x the kernels take (the catalog's); float64 would run in float32 inside, silently
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_rows(op: str, x: torch.Tensor, **params: torch.Tensor) -> None:
    """One-line InputError unless x is float16/bfloat16/float32 with a non-empty last dim and each
    per-column parameter (weight, bias) a float vector of that length: a shorter one would be read past
    its end."""
    if x.dtype not in DTYPES:
        raise InputError(f"{op}: x must be float16, bfloat16 or float32, got {x.dtype}")
    n = x.shape[-1] if x.ndim else 1
    if n == 0:
        raise InputError(f"{op}: x's last dim is empty (shape {tuple(x.shape)})")
    for name, p in params.items():  # torch.Size compares as a tuple: no conversion (on every patched call)
        if p.shape != (n,) or not p.dtype.is_floating_point:
            raise InputError(f"{op}: {name} must be a float vector of x's last dim ({n},), got {p.dtype} "
                             f"{tuple(p.shape)}")


def rows_view(x: torch.Tensor) -> torch.Tensor:
    """[..., n] -> (rows, n) with a contiguous last dim (a copy only when the last dim is strided)."""
    x2 = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


# ------------------------------------------------------------------ approximate exp and division

# Smallest normal float32: ex2.approx.ftz flushes results below it to +0.
FLT_MIN: tl.constexpr = tl.constexpr(2.0**-126)
# log2(e) rounded to float32 (0x3FB8AA3B): the factor exp_ftz multiplies by before ex2 (the twin's)
LOG2E_F32: tl.constexpr = tl.constexpr(TWIN_LOG2E_F32)


@triton.jit
def exp_ftz(x):
    """exp(x) as ex2.approx.ftz.f32(x * log2 e) (the product rounded as tl.exp rounds it): the bits
    tl.exp gives for results >= 2^-126, +0 below. tl.exp compiles to the non-ftz ex2.approx.f32,
    whose fix-up for subnormal results costs a compare and two predicated multiplies per element (5
    SASS instructions where this is 2); a softmax or attention probability below 2^-126 is zero to
    any tolerance. The interpreter takes numpy's exp2 of the same rounded product and flushes it the
    same way (as optwin.twin models it: at |x| ~ 40 the product's rounding moves exp by ~30 float32
    ulps, which an exp of x itself would not show)."""
    if INTERPRET:
        e = tl.exp2(x * LOG2E_F32)
        return tl.where(e < FLT_MIN, 0.0, e)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .f32 t; mul.f32 t, $1, 0f3FB8AA3B; ex2.approx.ftz.f32 $0, t; }", "=r,r", [x],
            dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def div_by_row(e, s):
    """e / s for one s per row: e * rcp.approx(s), the bits of the div.full.f32 that `e / s`
    compiles to wherever s lies in [2^-126, 2^126] (div.full.f32 scales both operands outside that
    range: two predicated multiplies per element; a softmax row sum is in [1, n], or NaN, which stays
    NaN). The reciprocal is taken once per row. The interpreter divides (numpy, correctly rounded)."""
    if INTERPRET:
        return e / s
    else:
        r = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [s], dtype=tl.float32,
                                      is_pure=True, pack=1)
        return e * r


@triton.jit
def store_cast(x, dtype: tl.constexpr):
    """x (fp32) to the output's dtype, rounded to nearest even: `x.to(dtype)` on the GPU (its cvt rounds).
    The interpreter truncates fp32 -> bf16 (every |y| <= |exact|: an RMSNorm's output RMS read 0.9972
    for 0.99997) and re-normalises fp32 subnormals wrongly (0x0003048e became bf16 0x0040), so there the
    bf16 bits are made by hand: the top 16 bits rounded to nearest even (a carry into the exponent is the
    right rounding, up to inf), a NaN quieted rather than rounded (its payload could carry into the sign)."""
    if INTERPRET and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        top = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        top = tl.where(x != x, (bits >> 16) | 0x40, top)
        return top.to(tl.uint16).to(dtype, bitcast=True)
    else:
        return x.to(dtype)


# ------------------------------------------------------------------ L2 prefetch


def prefetch_bytes(x2: torch.Tensor, window: bool = False) -> int:
    """Bytes of each row that prefetch_l2 may ask for: the row rounded down to 16 bytes, where x2 is on
    a GPU with the bulk-copy unit (sm_90+) and every row starts 16-byte aligned (cp.async.bulk's
    rule); 0 (no prefetch) elsewhere and in the interpreter. window: rows that start anywhere, asked for
    from the 16-byte boundary at or before their start (prefetch_row's VEC; x2's data 16-byte aligned),
    as many bytes, so the ask never passes the row's end."""
    if INTERPRETED or x2.device.type != "cuda" or not _has_bulk_copy(x2.device):
        return 0
    esize = x2.element_size()
    stride = 16 if window else x2.stride(0) * esize  # window: each row's ask starts at a 16-byte boundary
    return bulk_row_bytes(x2.data_ptr(), stride, x2.shape[1] * esize)


_BULK: dict[int, bool] = {}


def _has_bulk_copy(device: torch.device) -> bool:
    """An NVIDIA sm_90+ (cp.async.bulk; a ROCm build reports its own versions as capabilities), per
    device index, cached: this runs on every launch."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _BULK:
        _BULK[idx] = torch.version.hip is None and torch.cuda.get_device_capability(idx)[0] >= 9
    return _BULK[idx]


def bulk_row_bytes(base: int, row_stride_bytes: int, row_bytes: int) -> int:
    """prefetch_bytes's rule: row_bytes rounded down to 16 where every row start (base + i * stride)
    is 16-byte aligned, else 0."""
    if base % 16 or row_stride_bytes % 16:
        return 0
    return row_bytes // 16 * 16


def prefetch_args(op: str, block: int, x2: torch.Tensor, sketch: bool, grid: int, key: tuple[Any, ...],
                  depth: float | None = None, window: bool = False) -> dict[str, int]:
    """The PF_BYTES / pf_ahead arguments of a kernel that calls prefetch_row, for the launch (op, BLOCK,
    x2's element size, sketch) of prefetch_depth, or `depth` steps ahead (the bench's sweep): rows ahead of a
    persistent program's own rows (grid < rows), or, with a program per row, the row a program that
    many waves later reads (a wave: as many programs as the occupancy of `key` keeps resident; a
    fraction of a wave is the bench's). window: the kernel asks from each row's 16-byte boundary
    (prefetch_bytes)."""
    if depth is None:
        depth = prefetch_depth(op, block, x2, sketch)
    n_rows = x2.shape[0]
    nbytes = prefetch_bytes(x2, window) if depth > 0 else 0
    ahead = max(1, round(depth * (grid if grid < n_rows else resident_programs(key, x2.device))))
    return {"PF_BYTES": nbytes, "pf_ahead": ahead}


@triton.jit
def prefetch_row(X_ptr, r, pf_ahead, n_rows, X_row_stride, PF_BYTES: tl.constexpr, VEC: tl.constexpr = 1):
    """prefetch_l2 of row r + pf_ahead (past the end the last row again: a redundant hint, no branch); VEC > 1:
    from the VEC-element (16-byte) boundary at or before the row's start (rows that start anywhere)."""
    if PF_BYTES > 0:
        at = tl.cast(tl.minimum(r + pf_ahead, n_rows - 1), tl.int64) * X_row_stride
        if VEC > 1:
            at = at // VEC * VEC
        prefetch_l2(X_ptr + at, PF_BYTES)


@triton.jit
def prefetch_l2(ptr, NBYTES: tl.constexpr):
    """Ask the L2 for NBYTES at ptr (16-byte aligned, NBYTES a multiple of 16) without waiting and
    without a register: one cp.async.bulk.prefetch.L2 from thread 0. A program calls it for a row that
    it (persistent) or a program of a later wave (a program per row) reads, so DRAM keeps streaming
    while the warps sit in a row's reduction trees (with 2 programs per SM both can be between loads
    at once). A hint: nothing in y depends on it."""
    if NBYTES > 0:
        if not INTERPRET:
            tl.inline_asm_elementwise(
                "{ .reg .pred p; .reg .b32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
                "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
                "=r,l,r", [ptr, tl.full((), NBYTES, tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


# ------------------------------------------------------------------ reductions


@triton.jit
def _max_sum_sum(a0, a1, a2, b0, b1, b2):
    return tl.maximum(a0, b0), a1 + b1, a2 + b2


@triton.jit
def _max_sum_max(a0, a1, a2, b0, b1, b2):
    return tl.maximum(a0, b0), a1 + b1, tl.maximum(a2, b2)


@triton.jit
def _max_sum_max_min(a0, a1, a2, a3, b0, b1, b2, b3):
    return tl.maximum(a0, b0), a1 + b1, tl.maximum(a2, b2), tl.minimum(a3, b3)


@triton.jit
def max_sum_max_min(a, s, m, n):
    """(max a, sum s, max m, min n) over every axis in ONE reduction tree (one cross-warp exchange)."""
    if INTERPRET:
        return tl.max(a), tl.sum(s), tl.max(m), tl.min(n)
    else:
        return tl.reduce((a, s, m, n), None, _max_sum_max_min)


@triton.jit
def max_sum_max(a, s, m):
    """(max a, sum s, max m) over every axis in ONE reduction tree (one cross-warp exchange)."""
    if INTERPRET:
        return tl.max(a), tl.sum(s), tl.max(m)
    else:
        return tl.reduce((a, s, m), None, _max_sum_max)


@triton.jit
def _sum_max(a0, a1, b0, b1):
    return a0 + b0, tl.maximum(a1, b1)


@triton.jit
def sketch_sum_max(s, m):
    """(sum s, max m) over every axis in ONE tree: one cross-warp exchange, not two. For a sketch's
    statistics only: its sum need not be tl.sum's bits (sum_and_max). A persistent program runs it at
    its end, when every program ends at about the same time, so its barriers are the launch's tail."""
    if INTERPRET:
        return tl.sum(s), tl.max(m)
    else:
        return tl.reduce((s, m), None, _sum_max)


@triton.jit
def sum_and_max(s, m):
    """(tl.sum(s), tl.max(m)) over axis 0 as two separate trees. A combined tl.reduce((s, m)) saves
    a cross-warp exchange but its sum is NOT always bit-identical to tl.sum's: the H200 run of
    2026-11 showed different y bits at BLOCK 1024 (4 warps) and 2048 (8 warps, fp32), identical at
    16384. The op's sum must be tl.sum's, so the max gets its own tree."""
    return tl.sum(s, axis=0), tl.max(m, axis=0)


@triton.jit
def sum_squares(h, BLOCK: tl.constexpr):
    """sum of h*h over a [BLOCK] row: the squares of each 4 neighbours (4k..4k+3, one thread's
    registers) folded with explicit FMAs, fma(h0, h0, fma(h1, h1, fma(h2, h2, h3*h3))), then one
    tl.sum tree over the BLOCK/4 partials. The kernels compile without FMA contraction (the twin must
    know every rounding); explicit FMAs give Inductor's instruction count (1.25 instead of 2 per
    element) with a fixed order, the same with and without the sketch (optwin.twin.triton_reduce.sum_squares)."""
    if BLOCK >= 4:
        return tl.sum(fold4_squares(tl.reshape(h, [BLOCK // 4, 2, 2])), axis=0)
    else:
        return tl.sum(h * h, axis=0)


@triton.jit
def fold4_squares(q):
    """[..., 2, 2] (each 4 neighbours 4k..4k+3 in the last two dims, one thread's registers) -> [...]:
    fma(h0, h0, fma(h1, h1, fma(h2, h2, h3*h3))), the fold sum_squares and lane_sum_squares share."""
    even, odd = tl.split(q)  # [..., 2]: 4k + 2i, 4k + 2i + 1
    h0, h2 = tl.split(even)
    h1, h3 = tl.split(odd)
    return tl.fma(h0, h0, tl.fma(h1, h1, tl.fma(h2, h2, h3 * h3)))


@triton.jit
def finite_lanes(h, mask):
    """Per lane: (|h| if finite else 0, its square, 1.0 if in `mask` and NaN/±inf else 0.0)."""
    ah = tl.abs(h)
    fin = mask & (ah <= FMAX)  # NaN compares false
    a = tl.where(fin, ah, 0.0)
    return a, a * a, tl.where(fin, 0.0, tl.where(mask, 1.0, 0.0))


@triton.jit
def reduce_partials(a, q, nf):
    """(max a, sum q, sum nf) over every axis in ONE reduction tree."""
    if INTERPRET:  # the interpreter's multi-operand reduce is per-element Python (and rejects axis=None)
        return tl.max(a), tl.sum(q), tl.sum(nf)
    else:
        return tl.reduce((a, q, nf), None, _max_sum_sum)


@triton.jit
def finite_partials(h, mask):
    """(largest finite |h|, sum of finite h*h (float64), count of NaN/±inf) over the lanes in `mask`.

    h is a float32 block of any rank; one combined tree reduction. Non-finite lanes are zeroed
    before squaring, so one NaN does not erase the row's magnitude; the squares are float64, so a
    finite |h| up to FMAX does not overflow them (fp32 squares overflow past 1.8e19: the sketch read
    rms = inf where optwin.ingest has the value). The kernels call it only on the rare slow path (a
    row whose op sums came out non-finite) and for parameter vectors.
    """
    a, _, nf = finite_lanes(h, mask)
    a64 = a.to(tl.float64)
    return reduce_partials(a, a64 * a64, nf)


@triton.jit
def finite_partials_chunked(ptr, cols, n_cols, CHUNK: tl.constexpr):
    """finite_partials of the n_cols values at ptr, read CHUNK (= cols' width) at a time: (largest
    finite |v|, sum of finite v*v (float64), NaN/±inf count). For rows and parameter vectors past one block."""
    a = tl.zeros((), dtype=tl.float32)
    q = tl.zeros((), dtype=tl.float64)
    nf = tl.zeros((), dtype=tl.float32)
    for c0 in tl.range(0, n_cols, CHUNK):
        cm = c0 + cols < n_cols
        ca, cq, cnf = finite_partials(tl.load(ptr + c0 + cols, mask=cm, other=0.0).to(tl.float32), cm)
        a = tl.maximum(a, ca)
        q += cq
        nf += cnf
    return a, q, nf


# ------------------------------------------------------------------ per-thread (lane) partials
#
# A 1-D block of BLOCK elements loaded with 16-byte vectors is laid out as REPS x THREADS x VEC
# (element i = rep * THREADS * VEC + thread * VEC + v, THREADS = 32 * num_warps): reshaping it to
# [REPS, LANES, VEC // KEEP, KEEP] with LANES = THREADS and reducing axes 2 and 0 stays inside each
# thread (no shuffles, no shared memory: checked in the TTGIR of an offline sm_90 compile). The
# kernels keep [LANES, KEEP] accumulators across their row loop for statistics that only need a
# global value and reduce them across threads once per program. KEEP sets the independent
# dependency chains per thread: an in-thread reduction is one serial chain (a layernorm row at 4
# warps: 128 dependent max ops per row, ~0.5 µs of latency that 2 warps per scheduler cannot hide;
# H200, bench/results/sketch_lanes_h200_s11.md), KEEP chains of REPS * VEC / KEEP each.


def lane_shape(block: int, elem_bytes: int, num_warps: int) -> tuple[int, int]:
    """(VEC, LANES) for a BLOCK of elem_bytes-sized elements at num_warps: VEC elements per 16-byte
    vector, LANES <= 32 * num_warps lanes with BLOCK divisible by LANES * VEC (all powers of two)."""
    vec = max(1, min(16 // elem_bytes, block))
    return vec, max(1, min(32 * num_warps, block // vec))


@triton.jit
def _lanes4(x, BLOCK: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr, KEEP: tl.constexpr):
    return tl.reshape(x, [BLOCK // (LANES * VEC), LANES, VEC // KEEP, KEEP])


@triton.jit
def lane_sum(x, BLOCK: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr, KEEP: tl.constexpr = 1):
    """[BLOCK] -> [LANES, KEEP]: sums of each lane's own elements (in-thread, KEEP chains)."""
    return tl.sum(tl.sum(_lanes4(x, BLOCK, LANES, VEC, KEEP), 2), 0)


@triton.jit
def lane_sum_squares(x, BLOCK: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr, KEEP: tl.constexpr = 1):
    """lane_sum(x * x) with each 4 neighbours of a lane folded by explicit FMAs, as sum_squares folds
    them: fma(x0, x0, fma(x1, x1, fma(x2, x2, x3*x3))), then the lane's adds. The kernels compile
    without FMA contraction, so x * x then a sum was 2 instructions per element; this is 1.25. Where
    a lane has fewer than 4 elements per chain (KEEP > 1, small VEC), lane_sum(x * x)."""
    if KEEP == 1 and VEC >= 4:
        s = fold4_squares(tl.reshape(x, [BLOCK // (LANES * VEC), LANES, VEC // 4, 2, 2]))  # [REPS, LANES, VEC/4]
        return tl.reshape(tl.sum(tl.sum(s, 2), 0), [LANES, 1])
    else:
        return lane_sum(x * x, BLOCK, LANES, VEC, KEEP)


@triton.jit
def lane_max(x, BLOCK: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr, KEEP: tl.constexpr = 1):
    """[BLOCK] -> [LANES, KEEP]: maxima of each lane's own elements (in-thread, KEEP chains)."""
    return tl.max(tl.max(_lanes4(x, BLOCK, LANES, VEC, KEEP), 2), 0)


@triton.jit
def lane_min(x, BLOCK: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr, KEEP: tl.constexpr = 1):
    """[BLOCK] -> [LANES, KEEP]: minima of each lane's own elements (in-thread, KEEP chains)."""
    return tl.min(tl.min(_lanes4(x, BLOCK, LANES, VEC, KEEP), 2), 0)


# ------------------------------------------------------------------ cross-program sketch merge


@triton.jit
def last_program(T_ptr):
    """True in exactly one program: the last to take a ticket. The ticket is acq_rel (the relaxed
    merges before it are released; the last program acquires all of them) and the merges, the
    ticket and the finalizing reads are scalar atomics, issued by one thread of the program."""
    return last_of(T_ptr, tl.num_programs(0))


@triton.jit
def last_of(T_ptr, count):
    """last_program where `count` programs of the grid take a ticket (the others merge nothing)."""
    t = tl.atomic_add(T_ptr, 1, sem="acq_rel")
    return t == count - 1


@triton.jit
def read_slot(ptr):
    """A workspace slot's merged value, read by the last program (after last_program's acquire).

    A volatile load (bypasses L1), not an atomic exchange: Triton hands a scalar atomic's result to
    the whole program through shared memory between two barriers, so a chain of exchanges was one
    L2 round trip after another at the end of every launch (PTX of an offline sm_90 compile); the
    loads are in flight together. reset_workspace then restores the identities."""
    return tl.load(ptr, volatile=True)


@triton.jit
def reset_workspace(F_ptr, I_ptr):
    """Put the float64 slots back to their identities (the next sketch_buffer.SLOTS values) and the
    int64 slots (ticket and counts) to 0, ready for the next launch on this stream.
    The barrier comes first: a scalar load is done by every thread but a scalar store by one, and no
    warp may read a slot after another has reset it."""
    k = tl.arange(0, WS_SLOTS)
    idents = tl.load(F_ptr + WS_SLOTS + k)
    tl.debug_barrier()
    tl.store(F_ptr + k, idents)
    tl.store(I_ptr + k, tl.zeros([WS_SLOTS], dtype=tl.int64))


@triton.jit
def finish_norm_sketch(S_ptr, F_ptr, I_ptr, n_rows, n_cols):
    """The last program's common end of rmsnorm and layernorm, whose workspaces share their head
    (float absmax, sumsq; int ticket, nonfinite x, nonfinite parameters): read those slots, reset the
    workspace, store the shared features numel, rows, absmax, rms (over the finite entries), nonfinite
    (x's plus the parameters'), hidden. The op reads its own slots before calling it."""
    g_amax = read_slot(F_ptr + 0)
    g_sq = read_slot(F_ptr + 1)
    g_nf = read_slot(I_ptr + 1)
    g_param_nf = read_slot(I_ptr + 2)
    reset_workspace(F_ptr, I_ptr)
    numel = tl.cast(n_rows, tl.int64) * n_cols
    store_common_features(S_ptr, numel, tl.cast(n_rows, tl.int64), g_amax, g_sq, numel - g_nf, g_nf + g_param_nf)
    tl.store(S_ptr + 5, tl.cast(n_cols, tl.float64))


@triton.jit
def store_common_features(S_ptr, numel, rows, g_amax, g_sq, n_summed, nonfinite):
    """The head every op's sketch shares (optwin.ingest's COMMON_FEATURES), as float64: numel, rows,
    absmax, rms (g_sq over the n_summed entries whose squares it holds; at least 1), nonfinite.
    numel, rows, n_summed and nonfinite are int64."""
    tl.store(S_ptr + 0, numel.to(tl.float64))
    tl.store(S_ptr + 1, rows.to(tl.float64))
    tl.store(S_ptr + 2, g_amax)
    tl.store(S_ptr + 3, tl.sqrt(g_sq / tl.maximum(n_summed, 1).to(tl.float64)))
    tl.store(S_ptr + 4, nonfinite.to(tl.float64))


# ------------------------------------------------------------------ row records (a program per row)
#
# A launch with a program per row cannot afford a release-ordered step per program (an acq_rel
# ticket or a release add: its fence waits for the program's own output stores; H200, a program per
# row with the ticket cost rmsnorm +25 %, bench/results/norm_chunks_h200_s17a.md). Instead each row's
# program stores its partials as one 64-bit record word, two fp32 halves (sketch_buffer.row_records),
# and one extra program, the finisher, polls the words until neither half of any still holds the
# sentinel, reduces them, writes the sentinel back and stores the features. A word is
# self-validating half by half (no half of a written word is the sentinel), so nothing orders it
# against other memory: the finisher waits for the data itself, not for a flag. A row whose partials
# do not fit two fp32 (NaN/±inf in it, or h*h overflow) writes them to its extra record and then its
# word as RECORD_FLAG with release order; the finisher acquires the flag before reading the extra
# record (message passing, rare).
# The finisher spins while rows run, so a launch needs two resident programs; the interpreter runs
# programs in order and gets the finisher last.

# Width of the pieces a row launch's cold paths read (a flagged row's exact partials, the weight's):
# a whole row of float64 squares would set the kernel's register count.
EXACT_CHUNK = 1024
RECORD_POLL = 512  # record words the finisher reads per poll (4 KB: two per thread at 8 warps)
RECORD_FLAG_HI: tl.constexpr = tl.constexpr(0x7F800000)  # high half of a flagged word: +inf where a row's fp32 sum sits


@triton.jit
def record_word(lo, hi):
    """The 64-bit record of two fp32 values: lo's bits in the low half, hi's in the high half."""
    return (hi.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (lo.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def record_halves(words):
    """(low, high) int32 halves of record words; record_word's inverse before the bitcast."""
    return (words & 0xFFFFFFFF).to(tl.int32), (words >> 32).to(tl.int32)


@triton.jit
def globaltimer(x):
    """The GPU's global nanosecond timer (%globaltimer) as an int64 scalar, behind scalar x (any int: keeps the
    read in place); the interpreter gives 0. Bench probes only."""
    if INTERPRET:
        return tl.zeros((), dtype=tl.int64)
    else:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,l", [x.to(tl.int64)], dtype=tl.int64,
                                         is_pure=False, pack=1)


@triton.jit
def poll_records(M_ptr, r0, n_rows, POLL: tl.constexpr, WORDS: tl.constexpr = 1):
    """(low, high) int32 halves, each [POLL] (WORDS > 1: [POLL, WORDS], a row's words side by side),
    of the record words of rows r0 .. r0 + POLL - 1 (rows past n_rows read as zeros) once no half is
    the sentinel; the sentinel then goes back for the next launch. Volatile loads (no L1), re-issued
    until every word is written."""
    rows = r0 + tl.arange(0, POLL)
    if WORDS == 1:  # one word a row (rmsnorm's finisher): [POLL] halves, no [POLL, 1] for the caller to reshape
        ptrs = M_ptr + rows.to(tl.int64)
        valid = rows < n_rows
    else:
        ptrs = M_ptr + rows.to(tl.int64)[:, None] * WORDS + tl.arange(0, WORDS)[None, :]
        valid = (rows < n_rows)[:, None] & (tl.arange(0, WORDS) < WORDS)[None, :]
    words = tl.load(ptrs, mask=valid, other=0, volatile=True)
    lo, hi = record_halves(words)
    if INTERPRET:  # programs ran in order, the finisher last: a word still unwritten is a bug, not a wait
        assert tl.max(tl.reshape(tl.where((lo == -1) | (hi == -1), 1, 0), [POLL * WORDS]), axis=0) == 0, \
            "a row record was never written"
    else:
        while tl.max(tl.reshape(tl.where((lo == -1) | (hi == -1), 1, 0), [POLL * WORDS]), axis=0) > 0:
            words = tl.load(ptrs, mask=valid, other=0, volatile=True)
            lo, hi = record_halves(words)
    tl.store(ptrs, tl.full(ptrs.shape, -1, tl.int64), mask=valid)
    return lo, hi


@triton.jit
def release_flag(flag_ptr):
    """Store RECORD_FLAG_HI's word at flag_ptr (a row's last record word), released after every
    store before it (the row's extra record): the message of publish-then-flag."""
    tl.atomic_xchg(flag_ptr, tl.cast(RECORD_FLAG_HI, tl.int64) << 32, sem="release")


@triton.jit
def acquire_flagged(M_ptr, flagged, rows, n_rows, WORDS: tl.constexpr):
    """Acquire every flagged row of a finisher's poll (rows [POLL], flagged [POLL]; a row's flag is its last
    of WORDS record words), one by one in row order: each merged its partials into the workspace before its
    flag, and they are visible after this. Returns the poll's first flagged row (n_rows if none)."""
    first = tl.min(tl.where(flagged, rows, n_rows), axis=0)
    r = first
    while r < n_rows:  # rare
        acquired = acquire_flag(M_ptr + tl.cast(r, tl.int64) * WORDS + (WORDS - 1))  # 1, behind the acquire
        r = tl.min(tl.where(flagged & (rows > r), rows, n_rows) * acquired, axis=0)
    return first


@triton.jit
def acquire_flag(flag_ptr):
    """Acquire a flagged word (pairs with release_flag): the row's extra record is visible after it.
    Returns 1 (the flag word is never 0); use it in the extra record's loads, so every thread waits
    for the acquire (Triton hands a scalar atomic's result out behind a barrier)."""
    return tl.where(tl.atomic_add(flag_ptr, 0, sem="acquire") != 0, 1, 0)
