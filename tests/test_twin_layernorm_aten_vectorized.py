"""layernorm/torch twin against the two kernels F.layer_norm runs on CUDA (layer_norm_kernel.cu):
vectorized_layer_norm_kernel for rows of N % 4 == 0, RowwiseMomentsCUDAKernel + LayerNormForwardCUDAKernel
for the others. Independent scalar oracles of both, written here lane by lane in numpy float32 (FMAs
rounded once through exact fractions), must match the twin's no-noise path bit for bit.

    python -m pytest -q tests/test_twin_layernorm_aten_vectorized.py
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

from optwin import twin
from optwin.twin import layernorm
from optwin.twin.numerics import Numerics

F = np.float32
EPS = F(1e-5)


def _f32(q: Fraction) -> np.float32:
    """q rounded once to float32: to the nearest double, made odd when inexact (round to odd keeps the
    one rounding to float32 correct), then to float32."""
    d = float(q)
    if Fraction(d) != q and struct.unpack("<q", struct.pack("<d", d))[0] & 1 == 0:
        d = math.nextafter(d, math.inf if q > Fraction(d) else -math.inf)
    return F(d)


def _fma(a, b, c) -> np.float32:
    if not all(math.isfinite(float(v)) for v in (a, b, c)):  # inf and NaN have no fraction; float64 says the same
        with np.errstate(invalid="ignore"):
            return F(float(a) * float(b) + float(c))
    return _f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


def _online(val, wd):  # cuWelfordOnlineSum
    mean, s2, cnt = wd
    delta = val - mean
    new_count = cnt + F(1)
    new_mean = _fma(delta, F(1) / new_count, mean)  # mean + delta * (1.f/new_count)
    return new_mean, _fma(delta, val - new_mean, s2), new_count  # sigma2 + delta * (val - new_mean)


def _combine(b, a):  # cuWelfordCombine(dataB, dataA)
    delta = b[0] - a[0]
    count = a[2] + b[2]
    if not count > 0:
        return F(0), F(0), count
    coef = F(1) / count
    n_a, n_b = a[2] * coef, b[2] * coef
    mean = _fma(n_a, a[0], n_b * b[0])  # nA*dataA.mean + nB*dataB.mean
    s2 = _fma(delta * delta * a[2], n_b, a[1] + b[1])  # dataA.sigma2 + dataB.sigma2 + delta*delta*dataA.count*nB
    return mean, s2, count


def aten_oracle(x: list, gamma: list, beta: list, warps: int = 4):
    """One row through vectorized_layer_norm_kernel, thread by thread: (mean, var, rstd, y float32)."""
    n = len(x)
    assert n % 4 == 0
    threads = 32 * warps
    state = []
    for t in range(threads):  # thread t reads vectors t, t + 128, ... (4 consecutive elements each)
        wd = (F(0), F(0), F(0))
        for i in range(t, n // 4, threads):
            for k in range(4):
                wd = _online(x[4 * i + k], wd)
        state.append(wd)
    per_warp = []
    for w in range(warps):
        lanes = state[32 * w:32 * (w + 1)]
        for off in (16, 8, 4, 2, 1):  # WARP_SHFL_DOWN: a lane past the warp reads its own value
            lanes = [_combine(lanes[l], lanes[l + off] if l + off < 32 else lanes[l]) for l in range(32)]
        per_warp.append(lanes[0])
    off = warps // 2
    while off:
        per_warp = [_combine(per_warp[y], per_warp[y + off]) for y in range(off)]
        off //= 2
    mean, var = per_warp[0][0], per_warp[0][1] / F(n)
    rstd = F(1.0 / math.sqrt(float(var + EPS)))  # the twin's model of rsqrtf: correctly rounded
    y = [_fma(g, rstd * (v - mean), b) for v, g, b in zip(x, gamma, beta)]  # gamma * (rstd * (x - mean)) + beta
    return mean, var, rstd, y


def _rows(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """(4, n): a random row, an ill-conditioned one (|mean|/std ~ 1e4), a near-constant one (a few
    elements one ulp off), an exactly constant one."""
    g = torch.Generator().manual_seed(seed)
    r = 5 + torch.randn(n, generator=g, dtype=torch.float64)
    far = 1e4 + torch.randn(n, generator=g, dtype=torch.float64)
    c = torch.full((n,), 1000.3, dtype=torch.float64).to(dtype).double()
    near = c.clone()
    idx = torch.randperm(n, generator=g)[: max(1, n // 16)]
    near[idx] = torch.nextafter(c[idx].to(dtype), torch.tensor(math.inf, dtype=dtype)).double()
    return torch.stack([r, far, near, c]).to(dtype)


def _case(n: int, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + seed)
    return {"x": _rows(n, dtype, seed), "weight": (1 + 0.1 * torch.randn(n, generator=g)).to(dtype),
            "bias": (0.1 * torch.randn(n, generator=g)).to(dtype)}


def test_aten_vectorized_path_conditions() -> None:
    # `N <= (1ULL << std::numeric_limits<float>::digits) && N % num_vec_elems == 0`, float/Half/BFloat16
    assert layernorm.aten_vectorized(8, "float32") and layernorm.aten_vectorized(4096, "bfloat16")
    assert layernorm.aten_vectorized(1 << 24, "float16") and not layernorm.aten_vectorized((1 << 24) + 4, "float32")
    assert not layernorm.aten_vectorized(30, "float32") and not layernorm.aten_vectorized(1001, "float32")


def test_constant_rows() -> None:
    # 0.1f over 4096: 32 elements per thread, counts powers of two at every merge: mean exact, var 0, y = beta.
    n = 4096
    inp = {"x": torch.full((2, n), 0.1), "weight": torch.ones(n), "bias": torch.linspace(-0.3, 0.3, n)}
    c = torch.full((2, 1), 0.1).double()
    mean, var = layernorm.vectorized_welford(Numerics(), inp["x"].double())
    assert torch.equal(mean, c) and torch.equal(var, torch.zeros_like(var))
    res = twin.run("layernorm", "torch", "float32", inp)
    assert torch.equal(res.emulated, inp["bias"].double().expand(2, n)) and not any(res.faults.values())
    # 1000.3f over 12: threads 0..2 hold 4 each, the last shuffle merges counts 8 and 4: nA = 4 * fp32(1/12),
    # nB = 8 * fp32(1/12) sum past 1 and the mean lands one ulp above c, var still 0: y = beta + 316 (c - mean) w,
    # a precision_loss RowwiseMomentsCUDAKernel's merges (mean exact, y = bias) do not make.
    n = 12
    inp = {"x": torch.full((1, n), 1000.3), "weight": torch.ones(n), "bias": torch.zeros(n)}
    cf = F(1000.3)
    m, v, r, y = aten_oracle([cf] * n, [F(1)] * n, [F(0)] * n)
    assert m == np.nextafter(cf, F(np.inf)) and v == 0 and all(e == y[0] != 0 for e in y)
    res = twin.run("layernorm", "torch", "float32", inp)
    assert torch.equal(res.emulated, torch.full((1, n), float(y[0]), dtype=torch.float64))
    assert res.faults["precision_loss"]
    m_rowwise, _ = layernorm.rowwise_welford(Numerics(), inp["x"].double())
    assert m_rowwise.item() == float(cf)


def _ops_reduce(val, acc):  # WelfordOps::reduce
    mean, m2, nf = acc
    new_nf = nf + F(1)
    delta = val - mean
    new_mean = mean + delta / new_nf  # IEEE division, then the add: not fused
    return new_mean, _fma(delta, val - new_mean, m2), new_nf  # acc.m2 + delta * new_delta


def _ops_combine(a, b):  # WelfordOps::combine(a, b)
    if a[2] == 0:
        return b
    if b[2] == 0:
        return a
    delta = b[0] - a[0]
    new_count = a[2] + b[2]
    nb_over_n = b[2] / new_count
    return _fma(delta, nb_over_n, a[0]), _fma(delta * delta * a[2], nb_over_n, a[1] + b[1]), new_count


def _warp_reduce(lanes: list) -> tuple:
    for off in (16, 8, 4, 2, 1):  # WarpReduce: combine(val, warp_shfl_down(val, offset))
        lanes = [_ops_combine(lanes[l], lanes[l + off] if l + off < 32 else lanes[l]) for l in range(32)]
    return lanes[0]


def rowwise_oracle(x: list, gamma: list, beta: list, threads: int = 512):
    """One row through RowwiseMomentsCUDAKernel (512 threads, cuda_utils::BlockReduce) and
    LayerNormForwardCUDAKernel, thread by thread: (mean, var, rstd, y float32)."""
    n = len(x)
    state = []
    for t in range(threads):  # thread t reduces elements t, t + 512, ...
        acc = (F(0), F(0), F(0))
        for j in range(t, n, threads):
            acc = _ops_reduce(x[j], acc)
        state.append(acc)
    per_warp = [_warp_reduce(state[32 * w:32 * (w + 1)]) for w in range(threads // 32)]
    identity = (F(0), F(0), F(0))  # warp 0 reduces shared[lid] for lid < warps, the identity past them
    mean, m2, nf = _warp_reduce(per_warp + [identity] * (32 - len(per_warp)))
    var = m2 / nf  # project: m2 / divisor, correction 0
    rstd = F(1.0 / math.sqrt(float(var + EPS)))  # the twin's model of rsqrtf: correctly rounded
    y = [_fma((v - mean) * rstd, g, b) for v, g, b in zip(x, gamma, beta)]  # (x - mean) * rstd * gamma + beta
    return mean, var, rstd, y


# (kernel, n, dtype): the vectorized kernel at multiples of 4 (powers of two and counts whose 1/count is
# inexact), the rowwise kernels elsewhere (fewer elements than threads, one more than a block's, two runs).
KERNELS = {"vectorized": (layernorm.vectorized_welford, aten_oracle), "rowwise": (layernorm.rowwise_welford, rowwise_oracle)}


@pytest.mark.parametrize("kernel,n,dtype", [
    ("vectorized", 8, torch.float32), ("vectorized", 12, torch.float32), ("vectorized", 1000, torch.float32),
    ("vectorized", 1024, torch.float32), ("vectorized", 4096, torch.float32), ("vectorized", 64, torch.float16),
    ("vectorized", 520, torch.bfloat16), ("rowwise", 30, torch.float32), ("rowwise", 1001, torch.float32),
    ("rowwise", 7, torch.float32), ("rowwise", 513, torch.float32), ("rowwise", 2050, torch.float16),
    ("rowwise", 1001, torch.bfloat16)])
def test_twin_is_the_aten_kernel_bit_for_bit(kernel: str, n: int, dtype: torch.dtype) -> None:
    inp = _case(n, dtype, seed=n)
    dname = str(dtype).removeprefix("torch.")
    assert layernorm.aten_vectorized(n, dname) == (kernel == "vectorized")
    model, oracle = KERNELS[kernel]
    x64 = inp["x"].double()
    mean, var = model(Numerics(), x64)
    res = twin.run("layernorm", "torch", dname, inp)
    gamma, beta = [F(v) for v in inp["weight"].double().tolist()], [F(v) for v in inp["bias"].double().tolist()]
    for i in range(x64.shape[0]):
        m, v, r, y = oracle([F(e) for e in x64[i].tolist()], gamma, beta)
        assert mean[i, 0].item() == float(m) and var[i, 0].item() == float(v), (i, mean[i, 0].item(), m, var[i, 0].item(), v)
        num = Numerics()
        rstd = num.round(torch.rsqrt(num.round(var[i] + layernorm.EPS32, "float32")), "float32")
        assert rstd.item() == float(r)
        want = torch.tensor([float(e) for e in y], dtype=torch.float64).to(dtype).double()  # `implicitly cast to T`
        assert torch.equal(res.emulated[i], want), (i, (res.emulated[i] - want).abs().max().item())


def test_rowwise_nonfinite_rows_propagate() -> None:
    # Threads past the row hold empty states that combine returns around without arithmetic, so a clean
    # row stays exact; an inf makes its thread's m2 NaN (inf - inf) and the first merge with a finite
    # mean makes the mean NaN (fma(-inf, 1/2, inf)), as in the oracle.
    x = torch.zeros(2, 30, dtype=torch.float64)
    x[1, 3] = math.inf
    mean, var = layernorm.rowwise_welford(Numerics(), x)
    assert mean[0].item() == 0 and var[0].item() == 0
    with np.errstate(invalid="ignore"):
        m, v, _, _ = rowwise_oracle([F(e) for e in x[1].tolist()], [F(1)] * 30, [F(0)] * 30)
    assert math.isnan(m) and math.isnan(v) and math.isnan(mean[1].item()) and math.isnan(var[1].item())


@pytest.mark.parametrize("noise", ["stochastic", "mca", "order"])
@pytest.mark.parametrize("n", [1000, 1001])  # the vectorized kernel's model, the rowwise one's
def test_noise_modes_spread_the_aten_models(noise: str, n: int) -> None:
    inp = _case(n, torch.float32, seed=9)
    inp["x"] = inp["x"][:2]  # the random and the ill-conditioned row
    res = twin.run("layernorm", "torch", "float32", inp, noise=noise, replays=8, seed=1, keep_replays=True)
    assert res.replays.unique(dim=0).shape[0] > 1
    # the replays stay near the emulated output (the ill-conditioned row amplifies a mean's ulp ~1e4-fold)
    assert (res.replays - res.emulated).abs().max().item() < 1e-2
