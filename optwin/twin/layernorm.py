"""layernorm twin: torch (F.layer_norm on CUDA: aten's vectorized Welford kernel where it runs, else its
strided Welford), one-pass (E[h^2] - E[h]^2), triton (two-pass tree, or Welford over pieces where
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
from optwin.twin.numerics import (
    TRITON_WHOLE_ROW_MAX,
    Numerics,
    fma_odd,
    scalar32,
    sum_squares,
    triton_row_lanes,
    welford_chunk,
)

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


def welford(num: Numerics, h: torch.Tensor, lanes: int = 128, fma_update: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population variance as CUDA's layer_norm computes them: each of `lanes` threads runs
    Welford's update over its strided elements, then a tree of Welford merges; every op in fp32.
    A constant row keeps its mean exactly (every delta is 0), unlike sum / n.
    `fma_update`: the update as our Triton layernorm writes it (1/count rounded once, shared by the
    lanes; mean + delta * (1/count) and m2 + delta * (h - mean) each one FMA, one rounding)."""
    n = h.shape[-1]
    if num.noise == "order" and n > 1:  # a random element order and thread count, as num.sum does
        perm = torch.argsort(num.uniform(h), dim=-1)
        h = torch.gather(h, -1, perm)
        lanes = 2 ** int(torch.randint(5, 11, (1,), generator=num.gen))
    lanes = max(1, min(lanes, n))
    steps = -(-n // lanes)
    valid = torch.arange(steps * lanes).reshape(steps, lanes) < n  # (steps, lanes)
    x = torch.nn.functional.pad(h, (0, steps * lanes - n)).reshape(*h.shape[:-1], steps, lanes)
    mean, m2 = torch.zeros_like(x[..., 0, :]), torch.zeros_like(x[..., 0, :])  # (..., lanes)
    cnt = torch.zeros(lanes, dtype=torch.float64)
    for i in range(steps):
        c = cnt + valid[i]
        delta = num.round(x[..., i, :] - mean, F32)
        if fma_update:  # one rounding each
            new_mean = num.round(fma_odd(delta, _lane_constant(num, 1.0 / c.clamp_min(1), delta), mean), F32)
            new_m2 = num.round(fma_odd(delta, num.round(x[..., i, :] - new_mean, F32), m2), F32)
        else:
            new_mean = num.round(mean + num.round(delta / c.clamp_min(1), F32), F32)
            new_m2 = num.round(m2 + num.round(delta * num.round(x[..., i, :] - new_mean, F32), F32), F32)
        mean, m2 = torch.where(valid[i], new_mean, mean), torch.where(valid[i], new_m2, m2)
        cnt = c
    while mean.shape[-1] > 1:  # tree of merges (warp shuffles, then across warps)
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
# caching allocator's fresh tensors, which the twin assumes), else RowwiseMomentsCUDAKernel (`welford`).
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
    Under noise "order" the elements are permuted at random (per replay and row) and the thread count
    drawn from {32, ..., 1024}, as num.sum does."""
    n = h.shape[-1]
    if num.noise == "order" and n > 1:
        perm = torch.argsort(num.uniform(h), dim=-1)
        h = torch.gather(h, -1, perm)
        threads = 2 ** int(torch.randint(5, 11, (1,), generator=num.gen))
    nvec = n // ATEN_VEC
    steps = -(-nvec // threads)
    valid = torch.arange(steps * threads).reshape(steps, threads) < nvec  # (steps, threads)
    x = torch.nn.functional.pad(h, (0, steps * threads * ATEN_VEC - n))
    x = x.reshape(*h.shape[:-1], steps, threads, ATEN_VEC)  # [..., s, t, k] = element 4 (s threads + t) + k
    mean, m2 = torch.zeros_like(x[..., 0, :, 0]), torch.zeros_like(x[..., 0, :, 0])  # (..., threads)
    cnt = torch.zeros(threads, dtype=torch.float64)
    for s in range(steps):
        for k in range(ATEN_VEC):
            v = x[..., s, :, k]
            c = cnt + valid[s]  # new_count = curr_sum.count + 1.f (exact)
            delta = num.round(v - mean, F32)
            new_mean = num.round(fma_odd(delta, _lane_constant(num, 1.0 / c.clamp_min(1), delta), mean), F32)
            new_m2 = num.round(fma_odd(delta, num.round(v - new_mean, F32), m2), F32)
            mean, m2 = torch.where(valid[s], new_mean, mean), torch.where(valid[s], new_m2, m2)
            cnt = c
    warps = threads // ATEN_WARP
    state = (mean.unflatten(-1, (warps, ATEN_WARP)), m2.unflatten(-1, (warps, ATEN_WARP)), cnt.reshape(warps, ATEN_WARP))
    off = ATEN_WARP // 2
    while off:  # intra-warp shuffles: lane l < off takes lane l + off (the lanes past it do not reach lane 0)
        state = _welford_combine(num, tuple(t[..., :off] for t in state), tuple(t[..., off:2 * off] for t in state))
        off //= 2
    mean, m2, cnt = (t[..., 0] for t in state)  # (..., warps) lane 0 of each warp; cnt (warps,)
    off = warps // 2
    while off:  # inter-warp, through shared memory: warp y < off merges warp y + off
        b, a = (mean[..., :off], m2[..., :off], cnt[:off]), (mean[..., off:2 * off], m2[..., off:2 * off], cnt[off:2 * off])
        mean, m2, cnt = _welford_combine(num, b, a)
        off //= 2
    return mean, num.round(m2 / n, F32)  # (..., 1) each


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
    if variant == "torch":  # RowwiseMomentsCUDAKernel + LayerNormForwardCUDAKernel
        m, var = welford(num, h)  # (..., 1) fp32 each
        return num.round(_normalize(num, h, m, var, w, b), dtype)
    if variant == "one-pass":
        m = num.mean(h, keepdim=True)  # (..., 1) fp32
        ms = num.mean(num.round(h * h, F32), keepdim=True)  # E[h^2] fp32
        # E[h^2] - E[h]^2 cancels catastrophically once |mean| / std ~ 2^12 (and can go negative).
        var = num.round(ms - num.round(m * m, F32), F32)
        return num.round(_normalize(num, h, m, var, w, b), dtype)
    if variant == "triton" and welford_chunk(n):
        m, var = welford(num, h, lanes=welford_chunk(n), fma_update=True)
        return num.round(_normalize(num, h, m, var, w, b, fused=True), dtype)
    if variant == "triton":
        # one tl.sum tree per sum, or per-lane sums over the kernel's chunks and then the tree
        lanes = triton_row_lanes(n)
        m = num.round(num.sum(h, order="blocked", lanes=lanes, keepdim=True) / n, F32)
        dev = num.round(h - m, F32)
        var = num.round(sum_squares(num, dev) / n, F32)
        # rows held whole end in an explicit FMA, ((h - m) * r) * w + b with one rounding
        return num.round(_normalize(num, h, m, var, w, b, fused=n <= TRITON_WHOLE_ROW_MAX), dtype)
    raise ValueError(f"layernorm: no twin for variant {variant!r}")
