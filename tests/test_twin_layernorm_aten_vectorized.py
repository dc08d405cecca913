"""layernorm/torch twin against aten's vectorized_layer_norm_kernel (layer_norm_kernel.cu), the kernel
F.layer_norm runs on CUDA for rows of N % 4 == 0: an independent scalar oracle of that kernel, written
here lane by lane in numpy float32 (FMAs rounded once through exact fractions), must match the twin's
no-noise path bit for bit; other N keep the strided Welford model.

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
from optwin.twin import TWIN_VERSION, layernorm
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


@pytest.mark.parametrize("n,dtype", [(8, torch.float32), (12, torch.float32), (1000, torch.float32),
                                     (1024, torch.float32), (4096, torch.float32), (64, torch.float16),
                                     (520, torch.bfloat16)])
def test_twin_is_the_vectorized_kernel_bit_for_bit(n: int, dtype: torch.dtype) -> None:
    inp = _case(n, dtype, seed=n)
    dname = str(dtype).removeprefix("torch.")
    x64 = inp["x"].double()
    mean, var = layernorm.vectorized_welford(Numerics(), x64)
    res = twin.run("layernorm", "torch", dname, inp)
    gamma, beta = [F(v) for v in inp["weight"].double().tolist()], [F(v) for v in inp["bias"].double().tolist()]
    for i in range(x64.shape[0]):
        m, v, r, y = aten_oracle([F(e) for e in x64[i].tolist()], gamma, beta)
        assert mean[i, 0].item() == float(m) and var[i, 0].item() == float(v), (i, mean[i, 0].item(), m, var[i, 0].item(), v)
        num = Numerics()
        rstd = num.round(torch.rsqrt(num.round(var[i] + layernorm.EPS32, "float32")), "float32")
        assert rstd.item() == float(r)
        want = torch.tensor([float(e) for e in y], dtype=torch.float64).to(dtype).double()  # `implicitly cast to T`
        assert torch.equal(res.emulated[i], want), (i, (res.emulated[i] - want).abs().max().item())


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
    # a precision_loss the strided model (mean exact, y = bias) does not see.
    n = 12
    inp = {"x": torch.full((1, n), 1000.3), "weight": torch.ones(n), "bias": torch.zeros(n)}
    cf = F(1000.3)
    m, v, r, y = aten_oracle([cf] * n, [F(1)] * n, [F(0)] * n)
    assert m == np.nextafter(cf, F(np.inf)) and v == 0 and all(e == y[0] != 0 for e in y)
    res = twin.run("layernorm", "torch", "float32", inp)
    assert torch.equal(res.emulated, torch.full((1, n), float(y[0]), dtype=torch.float64))
    assert res.faults["precision_loss"]
    m_old, _ = layernorm.welford(Numerics(), inp["x"].double())
    assert m_old.item() == float(cf)


@pytest.mark.parametrize("n", [30, 1001])
def test_n_not_a_multiple_of_4_keeps_the_strided_model(n: int) -> None:
    inp = _case(n, torch.float32, seed=3)
    x = twin.to_float64(inp)
    num = Numerics()
    m, var = layernorm.welford(num, x["x"])
    want = num.round(layernorm._normalize(num, x["x"], m, var, x["weight"], x["bias"]), "float32")
    assert torch.equal(twin.run("layernorm", "torch", "float32", inp).emulated, want)


@pytest.mark.parametrize("noise", ["stochastic", "mca", "order"])
def test_noise_modes_spread_the_vectorized_model(noise: str) -> None:
    inp = _case(1000, torch.float32, seed=9)
    inp["x"] = inp["x"][:2]  # the random and the ill-conditioned row
    res = twin.run("layernorm", "torch", "float32", inp, noise=noise, replays=8, seed=1, keep_replays=True)
    assert res.replays.unique(dim=0).shape[0] > 1
    # the replays stay near the emulated output (the ill-conditioned row amplifies a mean's ulp ~1e4-fold)
    assert (res.replays - res.emulated).abs().max().item() < 1e-2


def test_twin_version_bumped_for_the_vectorized_model() -> None:
    assert TWIN_VERSION == "3"
