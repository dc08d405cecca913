"""The softmax sketch's exact per-row statistics and the program's publish step, shared by the
row-in-registers kernel (optwin.kernels.softmax) and the long-row kernels (optwin.kernels.softmax_long).

A row's exact statistics (_row_stats_chunked, _exact_row_chunked) re-read it in CHUNK-column pieces
(few registers; the slow paths of the row-in-registers kernel); _merge_extremes folds a row's finite
max and min into a program's partials; publish_sketch adds a program's partials to the "softmax"
workspace and, in the last of the programs that publish, writes the features; _max_min and _sum_pair
carry two values through one tree.
"""

from __future__ import annotations

import triton
import triton.language as tl

from optwin.kernels._common import (
    FMAX,
    INTERPRET,
    exp_ftz,
    last_of,
    read_slot,
    reset_workspace,
    store_common_features,
)

# softmax.VARIANT 4: a row whose finite |h| reaches HUGE (HF masks with finfo.min, -3.4e38; or +inf) sums its
# squares scaled by HUGE_SCALE in its own lane accumulator instead of the plain one (whose squares
# overflow), and every row's range is kept halved, so such rows stay in the main loop: before, every program
# holding one re-read all its rows in the exact pass, on every call of a masked HF attention. Below
# HUGE a lane's FLUSH * BLOCK/LANES squares stay < 2^(9 + 112) < FMAX; scaled, |h| <= FMAX gives
# squares <= 2^112 too. What underflows in the scaled squares is |h| < 2^-2: < 2^-100 of such a
# row's sum (which holds a square >= 2^112 before scaling).
HUGE: tl.constexpr = tl.constexpr(2.0**56)
HUGE_SCALE: tl.constexpr = tl.constexpr(2.0**-72)
HUGE_UNSCALE: tl.constexpr = tl.constexpr(2.0**144)


@triton.jit
def _max_min(a0, a1, b0, b1):
    """Combine of a tree carrying (max, min) (max and min are exact in any tree)."""
    return tl.maximum(a0, b0), tl.minimum(a1, b1)


@triton.jit
def _sum2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _sum_pair(e, ed):
    """(sum e, sum ed) in one tree (two trees in the interpreter, which has no tuple reduce): a row's s and
    the sketch's t = sum e * (h - m)."""
    if INTERPRET:
        return tl.sum(e, 0), tl.sum(ed, 0)
    else:
        return tl.reduce((e, ed), 0, _sum2)


@triton.jit
def _peaked(s, t, peak_nats):
    """1 if the row's softmax entropy log(s) - t/s is below peak_nats, else 0 (int32)."""
    return (tl.log(s) - t / s < peak_nats).to(tl.int32)


@triton.jit
def _row_stats_chunked(X_row, n_cols, CHUNK: tl.constexpr):
    """A row's exact statistics re-read in CHUNK-column pieces (few registers): (sumsq (float64),
    nonfinite (NaN/+inf), -inf count, finite max, finite min; max < min when no entry is finite)."""
    sq = tl.zeros((), dtype=tl.float64)
    nf = tl.zeros((), dtype=tl.int64)
    nneg = tl.zeros((), dtype=tl.int64)
    rmax = tl.full((), -float("inf"), tl.float32)
    rmin = tl.full((), float("inf"), tl.float32)
    for c in tl.range(0, n_cols, CHUNK):
        cc = c + tl.arange(0, CHUNK)
        cm = cc < n_cols
        h = tl.load(X_row + cc, mask=cm, other=-float("inf")).to(tl.float32)
        ah = tl.abs(h)
        fin = ah <= FMAX  # padding is -inf: never finite
        a = tl.where(fin, ah, 0.0)
        a64 = a.to(tl.float64)
        sq += tl.sum(a64 * a64, 0)
        nf += tl.sum(tl.where(fin | (h < -FMAX) | (~cm), 0, 1), 0).to(tl.int64)  # NaN, +inf
        nneg += tl.sum(tl.where(cm & (h == -float("inf")), 1, 0), 0).to(tl.int64)
        rmax = tl.maximum(rmax, tl.max(tl.where(fin, h, -float("inf")), 0))
        rmin = tl.minimum(rmin, tl.min(tl.where(fin, h, float("inf")), 0))
    return sq, nf, nneg, rmax, rmin


@triton.jit
def _exact_row_chunked(X_row, n_cols, peak_nats, CHUNK: tl.constexpr):
    """Slow path (a row with NaN/+inf or a finite |h| >= BIG), re-read in CHUNK-column pieces so it
    adds few registers to the kernel: (sumsq (float64), nonfinite, -inf count, max, min,
    eligible, peaked) over the row. The entropy sums are chunk-ordered fp32 (only the peaked test
    reads them)."""
    sq, nf, nneg, rmax, rmin = _row_stats_chunked(X_row, n_cols, CHUNK)
    has = rmax >= rmin
    elig = (nf == 0) & has  # finite entries only (squares overflowed): still eligible
    peak = tl.zeros((), dtype=tl.int32)
    if elig:
        s = tl.zeros((), dtype=tl.float32)
        t = tl.zeros((), dtype=tl.float32)
        for c in tl.range(0, n_cols, CHUNK):
            cc = c + tl.arange(0, CHUNK)
            h = tl.load(X_row + cc, mask=cc < n_cols, other=-float("inf")).to(tl.float32)
            d = h - rmax
            e = exp_ftz(d)
            s += tl.sum(e, 0)
            t += tl.sum(tl.where(e > 0.0, e * d, 0.0), 0)
        peak = _peaked(s, t, peak_nats)
    return sq, nf, nneg, rmax, rmin, elig.to(tl.int32), peak


@triton.jit
def _merge_extremes(p_max, p_min, p_rng, p_rmx, rmax, rmin, F_ptr):
    """A slow-path row's finite max and min merged into the program's max, min and smallest row max
    (a row without a finite entry has rmax = -inf < rmin = +inf and adds nothing). Its range goes
    straight to the workspace's float64 slot: two finite float32 values can lie more than FMAX apart
    (3e38 and -3e38), and the float32 difference would be inf where ingest has 6e38. Only slow rows
    can (their squares overflow), so the main loop keeps its float32 range."""
    has = rmax >= rmin
    rng = tl.where(has, rmax.to(tl.float64) - rmin.to(tl.float64), 0.0)
    tl.atomic_max(F_ptr + 3, rng, sem="relaxed")  # the max_row_range slot
    return (tl.maximum(p_max, rmax), tl.minimum(p_min, rmin), p_rng,
            tl.minimum(p_rmx, tl.where(has, rmax, float("inf"))))


@triton.jit
def fresh_partials():
    """A program's sketch partials before its first row: max, min, widest row range (the lane layouts
    keep it halved), smallest row max (rows with a finite entry) in float32; sum of squares in float64;
    NaN/+inf and -inf counts in int64; masked, peaked (eligible rows with entropy < peak_nats) and
    eligible rows (a finite entry and no NaN/+inf) in int32 (fewer loop-carried registers; < 2**31
    rows). absmax is max(max, -min)."""
    return (tl.full((), -float("inf"), tl.float32), tl.full((), float("inf"), tl.float32),
            tl.zeros((), dtype=tl.float32), tl.full((), float("inf"), tl.float32), tl.zeros((), dtype=tl.float64),
            tl.zeros((), dtype=tl.int64), tl.zeros((), dtype=tl.int64), tl.zeros((), dtype=tl.int32),
            tl.zeros((), dtype=tl.int32), tl.zeros((), dtype=tl.int32))


@triton.jit
def publish_sketch(S_ptr, F_ptr, I_ptr, p_max, p_min, p_rng, p_rmx, p_sq, p_nf, p_neg, p_masked, p_peak, p_elig,
                   n_rows, n_cols, n_pub, RNG_SCALE: tl.constexpr, PROBE_SKIP: tl.constexpr = 0):
    """A program's partials into the workspace (scalar atomics); the last of the n_pub programs that
    publish (acq_rel ticket) reads them back, resets the workspace and writes the softmax features.
    p_rng is the widest row range over RNG_SCALE (the lane layouts keep it halved).
    PROBE_SKIP (bench only, softmax's PROBE bits 128, 512, 1024, 2048; the sketch is then wrong): 1 no
    merge at all (the ticket and the end alone), 2 no float merges, 4 no integer merges, 8 only every
    8th program merges (how the cost grows with the merges into one line)."""
    merges = (PROBE_SKIP // 8 % 2 == 0) or (tl.program_id(0) % 8 == 0)
    if PROBE_SKIP % 2 == 0 and merges:
        _atomic_partials(F_ptr, I_ptr, p_max, p_min, p_rng, p_rmx, p_sq, p_nf, p_neg, p_masked, p_peak, p_elig,
                         RNG_SCALE, PROBE_SKIP // 2 % 2 == 0, PROBE_SKIP // 4 % 2 == 0)
    if last_of(I_ptr, n_pub):
        g_sq, g_max, g_min, g_rng, g_rmx, g_nf, g_neg, g_masked, g_peak, g_elig = take_workspace(F_ptr, I_ptr)
        # absmax from the merged extremes: max over programs commutes with max(max, -min, 0), so it
        # needs no merge of its own (0 where no entry is finite: -inf, -inf and 0)
        g_amax = tl.maximum(tl.maximum(g_max, -g_min), 0.0)
        _store_features(S_ptr, n_rows, n_cols, g_amax, g_sq, g_max, g_min, g_rng, g_rmx, g_nf, g_neg,
                        g_masked, g_peak, g_elig)


@triton.jit
def take_workspace(F_ptr, I_ptr):
    """The "softmax" workspace's merged partials (_atomic_partials' slots: sum of squares, max, min, widest row
    range, smallest row max as float64; NaN/+inf, -inf, masked, peaked and eligible counts as int64), read
    after the merges were acquired, and the workspace reset to its identities."""
    g_sq = read_slot(F_ptr + 0)
    g_max = read_slot(F_ptr + 1)
    g_min = read_slot(F_ptr + 2)
    g_rng = read_slot(F_ptr + 3)
    g_rmx = read_slot(F_ptr + 4)
    g_nf = read_slot(I_ptr + 1)
    g_neg = read_slot(I_ptr + 2)
    g_masked_peak = read_slot(I_ptr + 3)
    g_elig = read_slot(I_ptr + 4)
    reset_workspace(F_ptr, I_ptr)
    return g_sq, g_max, g_min, g_rng, g_rmx, g_nf, g_neg, g_masked_peak & 0xFFFFFFFF, g_masked_peak >> 32, g_elig


@triton.jit
def _atomic_partials(F_ptr, I_ptr, p_max, p_min, p_rng, p_rmx, p_sq, p_nf, p_neg, p_masked, p_peak, p_elig,
                     RNG_SCALE: tl.constexpr, FLOATS: tl.constexpr = True, INTS: tl.constexpr = True):
    """A program's partials merged into the workspace's slots (relaxed scalar atomics, one thread).
    Nine merges, not eleven: absmax comes from max and min at the end, and the masked and peaked row
    counts share one 64-bit add (masked in the low half, peaked in the high: each total is below
    2**31 rows, so the low half never carries into the high)."""
    if FLOATS:
        tl.atomic_add(F_ptr + 0, p_sq, sem="relaxed")
        tl.atomic_max(F_ptr + 1, p_max.to(tl.float64), sem="relaxed")
        tl.atomic_min(F_ptr + 2, p_min.to(tl.float64), sem="relaxed")
        tl.atomic_max(F_ptr + 3, p_rng.to(tl.float64) * RNG_SCALE, sem="relaxed")
        tl.atomic_min(F_ptr + 4, p_rmx.to(tl.float64), sem="relaxed")
    if INTS:
        tl.atomic_add(I_ptr + 1, p_nf, sem="relaxed")
        tl.atomic_add(I_ptr + 2, p_neg, sem="relaxed")
        tl.atomic_add(I_ptr + 3, p_masked.to(tl.int64) + (p_peak.to(tl.int64) << 32), sem="relaxed")
        tl.atomic_add(I_ptr + 4, p_elig.to(tl.int64), sem="relaxed")


@triton.jit
def _store_features(S_ptr, n_rows, n_cols, g_amax, g_sq, g_max, g_min, g_rng, g_rmx, g_nf, g_neg, g_masked, g_peak,
                    g_elig):
    """The softmax features from the launch's merged partials (float64 extremes, int64 counts)."""
    numel = tl.cast(n_rows, tl.int64) * n_cols
    any_fin = g_max >= g_min
    # abs: g_amax = max(max, -min, 0) is -0.0 for a -0.0-only input where maximum keeps its first operand
    # on ties (the interpreter's numpy; LLVM's maxnum may pick either zero), ingest's abs().amax() +0.0
    g_amax = tl.abs(g_amax)
    store_common_features(S_ptr, numel, tl.cast(n_rows, tl.int64), g_amax, g_sq, numel - g_nf - g_neg, g_nf)
    tl.store(S_ptr + 5, tl.cast(n_cols, tl.float64))
    tl.store(S_ptr + 6, tl.where(any_fin, g_max, 0.0))
    tl.store(S_ptr + 7, tl.where(any_fin, g_min, 0.0))
    tl.store(S_ptr + 8, g_rng)
    tl.store(S_ptr + 9, g_masked.to(tl.float64))
    tl.store(S_ptr + 10, g_neg.to(tl.float64) / tl.maximum(numel, 1).to(tl.float64))
    tl.store(S_ptr + 11, g_peak.to(tl.float64) / tl.maximum(g_elig, 1).to(tl.float64))
    tl.store(S_ptr + 12, tl.where(any_fin, g_rmx, 0.0))
