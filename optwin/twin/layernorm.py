"""layernorm twin: torch (F.layer_norm on CUDA: aten's vectorized Welford kernel where it runs, else its
RowwiseMoments kernel's), one-pass (E[h^2] - E[h]^2), triton (two-pass tree, or Welford over pieces where
twin.numerics.welford_chunk says).

    python -c "import torch; from optwin import twin; x = (1e4 + torch.randn(2, 64)).half(); \
print(twin.run('layernorm', 'one-pass', 'float16', {'x': x, 'weight': torch.ones(64).half(), 'bias': torch.zeros(64).half()}).faults)"

Inputs are float64 views of dtype tensors, `x (..., hidden)`, `weight (hidden,)`, `bias (hidden,)`,
possibly with a leading replay dim. Each `num.round` is one rounding of the GPU code. rsqrt is
modelled correctly rounded (CUDA's rsqrtf is within 2 ulp).
"""

from __future__ import annotations

import torch

from optwin.catalog import CATALOG
from optwin.twin.numerics import TRITON_WHOLE_ROW_MAX, Numerics, fma_odd, scalar32, welford_chunk
from optwin.twin.triton_reduce import row_sum, row_sum_squares

EPS = CATALOG["layernorm"].constants["eps"]
F32 = "float32"
EPS32 = scalar32(EPS)  # `var + eps` in float32 code adds eps cast to float32


def reference(inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    x, w, b = inputs["x"], inputs["weight"], inputs["bias"]
    m = x.mean(-1, keepdim=True)
    var = ((x - m) ** 2).mean(-1, keepdim=True)  # population variance
    return (x - m) * torch.rsqrt(var + EPS) * w + b


def _normalize(num: Numerics, h: torch.Tensor, m: torch.Tensor, var: torch.Tensor, w: torch.Tensor,
               b: torch.Tensor, fused: bool = False) -> torch.Tensor:
    """((h - m) * rsqrt(var + eps)) * w + b, every operation rounded to float32 (`fused`: the last
    product and the add are one FMA, one rounding)."""
    r = num.round(torch.rsqrt(num.round(var + EPS32, F32)), F32)  # rsqrt(neg) = NaN, as on the GPU
    y = num.round(num.round(h - m, F32) * r, F32)
    return num.round(fma_odd(y, w, b), F32) if fused else num.round(num.round(y * w, F32) + b, F32)


def _lane_constant(num: Numerics, v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """fp32(v) for a per-lane constant v (lanes,), rounded once per replay (under replays it gets the
    replay dim, aligned to broadcast against `like`): a replay's noise never comes from another's."""
    return num.align(num.round(num.expand(v), F32), like=like)


def _thread_states(num: Numerics, h: torch.Tensor, threads: int, vec: int = 1,
                   divide: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each of `threads` threads' Welford state (mean (..., threads), m2 (..., threads), count (threads,))
    after its online updates over its elements in order: thread t reads the runs of `vec` consecutive
    elements numbered t, t + threads, ... Every op in fp32; the update `delta = h - mean; mean += delta / count;
    m2 += delta * (h - mean)` with m2's add of a product one FMA, and the mean's as the kernel writes it:
    fma(delta, fp32(1/count), mean) (one rounding), or with `divide` an IEEE division then an add."""
    n = h.shape[-1]
    runs = n // vec
    steps = -(-runs // threads)
    valid = torch.arange(steps * threads).reshape(steps, threads) < runs  # (steps, threads)
    x = torch.nn.functional.pad(h, (0, steps * threads * vec - n))
    # [..., s, t, k] = element vec (s threads + t) + k, then thread t's sequence down the rows (s, k)
    x = x.reshape(*h.shape[:-1], steps, threads, vec).transpose(-1, -2).reshape(*h.shape[:-1], steps * vec, threads)
    valid = valid.repeat_interleave(vec, dim=0)
    mean, m2 = torch.zeros_like(x[..., 0, :]), torch.zeros_like(x[..., 0, :])  # (..., threads)
    cnt = torch.zeros(threads, dtype=torch.float64)
    for i in range(steps * vec):
        v = x[..., i, :]
        c = cnt + valid[i]  # counts are exact small integers in fp32
        delta = num.round(v - mean, F32)
        if divide:
            new_mean = num.round(mean + num.round(delta / _lane_constant(num, c.clamp_min(1), delta), F32), F32)
        else:
            new_mean = num.round(fma_odd(delta, _lane_constant(num, 1.0 / c.clamp_min(1), delta), mean), F32)
        new_m2 = num.round(fma_odd(delta, num.round(v - new_mean, F32), m2), F32)
        mean, m2 = torch.where(valid[i], new_mean, mean), torch.where(valid[i], new_m2, m2)
        cnt = c
    return mean, m2, cnt


def welford(num: Numerics, h: torch.Tensor, lanes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population variance as our Triton layernorm's Welford kernel computes them
    (optwin.kernels.layernorm_welford): each of `lanes` lanes runs Welford's update over its strided
    elements (1/count rounded once, shared by the lanes; mean + delta * (1/count) and m2 + delta * (h -
    mean) each one FMA, one rounding), then a halving tree of Chan merges; every op in fp32.
    A constant row keeps its mean exactly (every delta is 0), unlike sum / n."""
    n = h.shape[-1]
    h, lanes = _order_noise(num, h, lanes)
    mean, m2, cnt = _thread_states(num, h, max(1, min(lanes, n)))
    while mean.shape[-1] > 1:  # the kernel's halving tree of merges over its lanes
        if mean.shape[-1] % 2:
            mean, m2 = (torch.nn.functional.pad(t, (0, 1)) for t in (mean, m2))
            cnt = torch.nn.functional.pad(cnt, (0, 1))
        half = mean.shape[-1] // 2
        ma, mb, qa, qb, na, nb = mean[..., :half], mean[..., half:], m2[..., :half], m2[..., half:], cnt[:half], cnt[half:]
        nn = na + nb  # counts are exact small integers in fp32
        frac = _lane_constant(num, nb / nn.clamp_min(1), ma)  # (R?, 1.., half)
        delta = num.round(mb - ma, F32)
        mean = num.round(ma + num.round(delta * frac, F32), F32)
        m2 = num.round(num.round(qa + qb, F32) + num.round(num.round(num.round(delta * delta, F32) * na, F32) * frac, F32), F32)
        cnt = nn
    return mean, num.round(m2 / n, F32)  # (..., 1) each


# aten/src/ATen/native/cuda/layer_norm_kernel.cu (torch 2.x, the same through 2.11's source), the path
# F.layer_norm takes on CUDA. LayerNormKernelImplInternal launches the vectorized kernel when
#   `(T is float || Half || BFloat16) && N <= (1ULL << std::numeric_limits<float>::digits) &&
#    N % num_vec_elems == 0 && can_vec_X && can_vec_Y && can_vec_gamma && can_vec_beta`
# (`constexpr int vec_size = 4;`; can_vec_*: the pointers aligned to 4 * sizeof(T), true of the
# caching allocator's fresh tensors, which the twin assumes), else RowwiseMomentsCUDAKernel (`rowwise_welford`).
# launch_vectorized_layer_norm_kernel: `const dim3 threads(warp_size, num_threads() / warp_size, 1)`,
# num_threads() = C10_WARP_SIZE * 4 (thread_constants.h): 4 warps of 32, one block per row.
ATEN_VEC = 4
ATEN_WARP = 32
ATEN_THREADS = 128
ATEN_VEC_MAX_N = 1 << 24


def aten_vectorized(n: int, dtype: str) -> bool:
    """Whether aten's layer_norm runs vectorized_layer_norm_kernel for rows of n (of contiguous, aligned
    tensors of dtype), not RowwiseMomentsCUDAKernel."""
    return dtype in ("float32", "float16", "bfloat16") and 0 < n <= ATEN_VEC_MAX_N and n % ATEN_VEC == 0


def _order_noise(num: Numerics, h: torch.Tensor, threads: int) -> tuple[torch.Tensor, int]:
    """Under noise "order": the row's elements permuted at random (per replay and row) and the thread
    count drawn from {32, ..., 1024}, as num.sum does; else (h, threads) unchanged."""
    if num.noise != "order" or h.shape[-1] <= 1:
        return h, threads
    h = torch.gather(h, -1, torch.argsort(num.uniform(h), dim=-1))
    return h, 2 ** int(torch.randint(5, 11, (1,), generator=num.gen))


def _warps_then_block(num: Numerics, state: tuple, combine) -> tuple[torch.Tensor, torch.Tensor]:
    """aten's two-level reduction of per-thread Welford states (mean (..., threads), m2 (..., threads),
    count (threads,)) to thread 0's (mean, m2), each (..., 1):
    - in each warp, `for (offset = C10_WARP_SIZE >> 1; offset > 0; offset >>= 1)` lane l combines its own
      state with WARP_SHFL_DOWN(state, offset), lane l + offset's (the lanes past it never reach lane 0);
    - the warps' lane-0 states, through shared memory, the same halving order: warp y < offset takes warp
      y + offset (cuda_utils::BlockReduce runs warp 0's WarpReduce over them, padded with empty states
      that combine to the other side unchanged, the same sequence of merges).
    `combine(num, own, other)` is the kernel's merge, own as the lower lane."""
    mean, m2, cnt = state
    warps = mean.shape[-1] // ATEN_WARP
    state = (mean.unflatten(-1, (warps, ATEN_WARP)), m2.unflatten(-1, (warps, ATEN_WARP)), cnt.reshape(warps, ATEN_WARP))
    for axis_len in (ATEN_WARP, warps):
        off = axis_len // 2
        while off:
            state = combine(num, tuple(t[..., :off] for t in state), tuple(t[..., off:2 * off] for t in state))
            off //= 2
        state = tuple(t[..., 0] for t in state)  # lane 0 of each warp (..., warps); then thread 0 (...)
    mean, m2, _ = state
    return mean.unsqueeze(-1), m2.unsqueeze(-1)


def _welford_combine(num: Numerics, b: tuple, a: tuple) -> tuple:
    """cuWelfordCombine(dataB, dataA) of layer_norm_kernel.cu, every op in float32:
        delta = dataB.mean - dataA.mean; count = dataA.count + dataB.count;
        coef = 1.f/count; nA = dataA.count * coef; nB = dataB.count * coef;
        mean = nA*dataA.mean + nB*dataB.mean;
        sigma2 = dataA.sigma2 + dataB.sigma2 + delta * delta * dataA.count * nB;
    (count 0: mean = sigma2 = 0). nvcc contracts (-fmad=true): mean = fma(nA, A.mean, nB * B.mean) (the
    first product fused, as LLVM's FMA combine picks), sigma2 = fma((delta*delta)*A.count, nB, A.s2 + B.s2).
    Each state is (mean (..., k), sigma2 (..., k), count (k,) exact small integers); 1.f/count (IEEE
    division without --use_fast_math) and the count products are per-lane constants (_lane_constant)."""
    (mb, qb, cb), (ma, qa, ca) = b, a
    cnt = ca + cb
    delta = num.round(mb - ma, F32)
    coef = _lane_constant(num, 1.0 / cnt.clamp_min(1), mb)
    n_a = num.round(ca * coef, F32)
    n_b = num.round(cb * coef, F32)
    mean = num.round(fma_odd(n_a, ma, num.round(n_b * mb, F32)), F32)
    dd = num.round(num.round(delta * delta, F32) * ca, F32)
    m2 = num.round(fma_odd(dd, n_b, num.round(qa + qb, F32)), F32)
    some = cnt > 0
    return torch.where(some, mean, torch.zeros_like(mean)), torch.where(some, m2, torch.zeros_like(m2)), cnt


def vectorized_welford(num: Numerics, h: torch.Tensor, threads: int = ATEN_THREADS) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population variance as aten's vectorized_layer_norm_kernel computes them (compute_stats),
    for rows of n (a multiple of 4), float32 throughout:
    - thread t (`thrx = threadIdx.x + threadIdx.y * blockDim.x`) reads vectors t, t + 128, ... (`for (int
      i = thrx; i < n_vec_to_read; i += numx)`), 4 consecutive elements each, and runs cuWelfordOnlineSum
      over their elements in order: `delta = val - mean; new_count = count + 1.f; new_mean = mean + delta
      * (1.f/new_count); sigma2 + delta * (val - new_mean)` (each add of a product one FMA);
    - `for (int offset = (C10_WARP_SIZE >> 1); offset > 0; offset >>= 1)`: lane l merges
      `cuWelfordCombine(wd, WARP_SHFL_DOWN(wd, offset))`, its own state as dataB, lane l + offset's as dataA;
    - across warps (`for (int offset = blockDim.y/2; offset > 0; offset /= 2)`): warp y < offset merges
      warp y + offset's lane-0 state the same way;
    - `wd.sigma2/float(N)`, correctly rounded.
    Noise "order": _order_noise."""
    n = h.shape[-1]
    h, threads = _order_noise(num, h, threads)
    mean, m2, cnt = _thread_states(num, h, threads, vec=ATEN_VEC)
    mean, m2 = _warps_then_block(num, (mean, m2, cnt), _welford_combine)
    return mean, num.round(m2 / n, F32)  # (..., 1) each


# The other rows (N % 4 != 0, or misaligned views): RowwiseMomentsCUDAKernel<T, T_ACC><<<M,
# cuda_utils::kCUDABlockReduceNumThreads>>> (512 threads, one block per row) with WelfordOps<T_ACC, T_ACC,
# int64_t, pair> (SharedReduceOps.h) and cuda_utils::BlockReduce, then LayerNormForwardCUDAKernel.
ATEN_ROWWISE_THREADS = 512


def _welford_ops_combine(num: Numerics, a: tuple, b: tuple) -> tuple:
    """WelfordOps::combine(a, b), every op in float32:
        if (a.nf == 0) return b; if (b.nf == 0) return a;
        delta = b.mean - a.mean; new_count = a.nf + b.nf; nb_over_n = b.nf / new_count;
        {a.mean + delta * nb_over_n, a.m2 + b.m2 + delta * delta * a.nf * nb_over_n, -1, new_count}
    nvcc contracts each add of a product to one FMA: mean = fma(delta, nb_over_n, a.mean), m2 =
    fma((delta*delta)*a.nf, nb_over_n, a.m2 + b.m2). nb_over_n (IEEE division) is a per-lane constant."""
    (ma, qa, ca), (mb, qb, cb) = a, b
    cnt = ca + cb
    frac = _lane_constant(num, cb / cnt.clamp_min(1), ma)
    delta = num.round(mb - ma, F32)
    mean = num.round(fma_odd(delta, frac, ma), F32)
    dd = num.round(num.round(delta * delta, F32) * ca, F32)
    m2 = num.round(fma_odd(dd, frac, num.round(qa + qb, F32)), F32)
    a_empty, b_empty = ca == 0, cb == 0  # the early returns: no arithmetic, so a NaN or inf passes unchanged
    mean = torch.where(a_empty, mb, torch.where(b_empty, ma, mean))
    m2 = torch.where(a_empty, qb, torch.where(b_empty, qa, m2))
    return mean, m2, cnt


def rowwise_welford(num: Numerics, h: torch.Tensor, threads: int = ATEN_ROWWISE_THREADS) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population variance as RowwiseMomentsCUDAKernel computes them, float32 throughout:
    - thread t runs WelfordOps::reduce over elements t, t + 512, ... (`for (j = threadIdx.x; j < N; j +=
      blockDim.x)`): `delta = data - mean; new_mean = mean + delta / new_nf; m2 + delta * (data -
      new_mean)` (the division IEEE and not fused; the last add of a product one FMA);
    - _warps_then_block with _welford_ops_combine; project: `m2 / nf`, correctly rounded.
    Noise "order" as vectorized_welford. Threads past the row's n hold empty states, which `combine` returns
    around unchanged, so a row narrower than the block runs on the next power of two >= n threads (at least a
    warp) with the same bits and a fraction of the work (n = 30: 32 lanes, not 512)."""
    n = h.shape[-1]
    h, threads = _order_noise(num, h, threads)
    threads = min(threads, max(ATEN_WARP, 1 << max(n - 1, 0).bit_length()))
    mean, m2, cnt = _thread_states(num, h, threads, divide=True)
    mean, m2 = _warps_then_block(num, (mean, m2, cnt), _welford_ops_combine)
    return mean, num.round(m2 / n, F32)  # (..., 1) each


# The widest rows the one-pass and triton float32 emulations' constant rows were checked at on a GPU
# (noise_free_rows)
CHECKED_WIDTH = 4096


def noise_free_rows(variant: str, dtype: str, inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor | None:
    """The exactly constant rows (..., 1) whose noisy replays are the deterministic emulation; None if none.

    Rounding noise stands in for the orders and roundings the emulation cannot pin down. A constant row's are
    pinned: its sums of h are multiples of c, its E[h^2] sums copies of fp32(c^2) in torch's reduce order
    (Numerics._cuda_reduce), every merge sees equal means, and the emulation (an uneven merge's one-ulp miss
    of the mean, one-pass's E[h^2] - m^2 below -eps) is the GPU's result row for row: 256 rows a width at
    384..4096 in every dtype on an H100, bench/gpu_constant_rows.py and bench/twin_constant_rows.py
    (bench/RESULTS.md, validate, stop 48). There the noise only invented faults: NaN in most one-pass
    replays of a constant row at widths 384 and 768 where the GPU gives none.
    triton float32 since stop 49: below 4096 a row is held in registers and its sums of c round in each
    thread's chain (triton_reduce), which the twin models; the H100's faults at 384..2048 are the twin's row
    for row (1024 of 1024 rows; with width 4096's, 1280 of 1280). Width 4096 takes the Welford kernel, whose merge tree the twin
    does not model, but a constant row's every delta is 0 so any order keeps mean c and M2 0 (y = bias), as
    the H100 gave on all 256 rows there. Rows wider than CHECKED_WIDTH keep their noise, triton float32 (no
    GPU rows: the register kernel at other widths, the chunked kernels' final sum past 65536) and one-pass
    (past 4096 the H100 was not asked; torch's reduce splits a few very long rows over blocks, which the twin
    does not model).
    """
    x = inputs["x"]  # (..., hidden)
    unchecked = variant == "one-pass" or (variant == "triton" and dtype == "float32")
    if unchecked and x.shape[-1] > CHECKED_WIDTH:  # no GPU rows to hold the emulation to
        return None
    if x.numel() == 0:
        return None
    const = x.amax(-1, keepdim=True) == x.amin(-1, keepdim=True)  # (..., 1)
    return const if bool(const.any()) else None


def twin(num: Numerics, variant: str, dtype: str, inputs: dict[str, torch.Tensor], params: dict) -> torch.Tensor:
    h = inputs["x"]  # (..., hidden); x.float() is exact
    w = num.align(inputs["weight"], like=h)  # (hidden,)
    b = num.align(inputs["bias"], like=h)
    n = h.shape[-1]
    if variant == "torch" and aten_vectorized(n, dtype):
        # vectorized_layer_norm_kernel_impl: `gamma * (rstd_val * (x - wd.mean)) + beta` in float32 (the
        # last product and the add contract to one FMA), `implicitly cast to T`: rounded again to dtype.
        m, var = vectorized_welford(num, h)  # (..., 1) fp32 each
        return num.round(_normalize(num, h, m, var, w, b, fused=True), dtype)
    if variant == "torch":
        # RowwiseMomentsCUDAKernel, then LayerNormForwardCUDAKernel: `(x - mean) * rstd * gamma + beta` in
        # T_ACC, the last product and the add one FMA.
        m, var = rowwise_welford(num, h)  # (..., 1) fp32 each
        return num.round(_normalize(num, h, m, var, w, b, fused=True), dtype)
    if variant == "one-pass":
        m = num.mean(h, keepdim=True)  # (..., 1) fp32
        ms = num.mean(num.round(h * h, F32), keepdim=True)  # E[h^2] fp32
        # E[h^2] - E[h]^2 cancels catastrophically once |mean| / std ~ 2^12 (and can go negative).
        var = num.round(ms - num.round(m * m, F32), F32)
        return num.round(_normalize(num, h, m, var, w, b), dtype)
    if variant == "triton" and welford_chunk(n):
        m, var = welford(num, h, lanes=welford_chunk(n))
        return num.round(_normalize(num, h, m, var, w, b, fused=True), dtype)
    if variant == "triton":
        # a row held whole: each sum one tl.sum in the kernel's layout; past TRITON_WHOLE_ROW_MAX per-lane sums over
        # the kernel's chunks and then the tree (triton_reduce.row_sum)
        m = num.round(row_sum(num, h, dtype, "layernorm") / n, F32)
        dev = num.round(h - m, F32)
        var = num.round(row_sum_squares(num, dev, dtype, "layernorm") / n, F32)
        # held whole, ((h - m) * r) * w + b is the kernel's explicit FMA, one rounding; the chunked kernels round
        # every product (no FMA)
        return num.round(_normalize(num, h, m, var, w, b, fused=n <= TRITON_WHOLE_ROW_MAX), dtype)
    raise ValueError(f"layernorm: no twin for variant {variant!r}")
