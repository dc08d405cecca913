"""optwin.twin.numerics against torch's own casts and float32 arithmetic, bit for bit.

    python -m pytest -q tests/test_twin_numerics.py
"""

from __future__ import annotations

import math

import pytest
import torch

from optwin.twin import numerics
from optwin.twin.numerics import (FORMATS, Numerics, cuda_mean_factor, perturb_mca, round_nearest, round_stochastic,
                                  torch_cast, ulps_between)

TORCH_FORMATS = ("float16", "bfloat16", "float32", "float8_e4m3fn", "float8_e5m2")
F64 = torch.float64


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bitwise equality of float64 tensors: NaN where NaN, equal values, equal signs (so -0.0 counts)."""
    assert got.shape == want.shape
    nan_g, nan_w = torch.isnan(got), torch.isnan(want)
    bad = (nan_g != nan_w) | (~nan_w & ((got != want) | (torch.signbit(got) != torch.signbit(want))))
    if bad.any():
        idx = bad.nonzero().flatten()[:5].tolist()
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.numel()} differ; first at {idx}: "
                             f"got {got[idx].tolist()} want {want[idx].tolist()}")


def f32_values(g: torch.Generator, n: int, lo: int, hi: int) -> torch.Tensor:
    """n random float32-representable values (as float64), exponents uniform in [lo, hi], random signs."""
    e = torch.randint(lo, hi + 1, (n,), generator=g)
    m = 1.0 + torch.randint(0, 2**23, (n,), generator=g).to(F64) / 2**23
    s = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(F64)
    return (s * torch.ldexp(m, e)).float().double()  # the float32 cast makes tiny ones subnormal


def edges(name: str) -> torch.Tensor:
    """Ties, subnormals, signed zeros, the overflow boundary and non-finite values of one format."""
    f = FORMATS[name]
    tiny, sub = f.tiny, 2.0 ** (f.emin - f.p + 1)
    one_ulp = 2.0 ** (1 - f.p)
    vals = [0.0, -0.0, math.nan, math.inf, -math.inf, 1.0, -1.0,
            1.0 + one_ulp / 2, 1.0 + 3 * one_ulp / 2, -(1.0 + one_ulp / 2),  # ties to even: down, up
            tiny, tiny * (1 - one_ulp / 4), sub, sub / 2, -sub / 2, sub * 1.5, sub / 4, -sub / 4, sub * 0.75,
            f.max, -f.max, f.max * (1 + one_ulp / 4), f.max * (1 + one_ulp / 2), f.max * 2]
    if name == "float16":
        vals += [65504.0, 65519.99, 65520.0, -65520.0, 65536.0, 2.0**-24, 2.0**-25, -(2.0**-26)]
    if name != "float32":
        vals += [3.0e38, 1e-40, -1e-45]
    return torch.tensor(vals, dtype=F64).float().double()


@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_round_nearest_matches_torch_cast_of_float32(name: str) -> None:
    f = FORMATS[name]
    g = torch.Generator().manual_seed(len(name))
    spread = f32_values(g, 20000, f.emin - f.p - 3, min(f.emax + 2, 127))  # subnormal, normal, overflow
    # Exact ties between neighbours of the format (representable in float32 for every format here).
    y = round_nearest(f32_values(g, 4000, f.emin - f.p + 1, min(f.emax - 1, 126)), f)
    ties = (y + torch.copysign(f.ulp(y), y) / 2).float().double()
    x = torch.cat([spread, ties, edges(name)])
    want = x.float().to(f.torch_dtype).double()
    assert_same(round_nearest(x, f), want, f"round_nearest {name}")
    assert_same(Numerics("none").round(x, f), want, f"Numerics.round {name}")
    assert_same(torch_cast(x, f), want, f"torch_cast {name}")


def test_specific_float16_edges() -> None:
    x = torch.tensor([65504.0, 65519.99, 65520.0, 1 + 2**-11, 1 + 3 * 2**-11, -(2.0**-26), 2.0**-25], dtype=F64)
    got = round_nearest(x, "float16")
    assert got[:3].tolist() == [65504.0, 65504.0, math.inf]
    assert got[3].item() == 1.0 and got[4].item() == 1 + 2**-9  # ties to even
    assert got[5].item() == 0.0 and torch.signbit(got[5])  # -0.0 keeps its sign
    assert got[6].item() == 0.0  # 2^-25 is the tie between 0 and the smallest subnormal: even is 0


@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_torch_cast_matches_torch_for_float64(name: str) -> None:
    f = FORMATS[name]
    g = torch.Generator().manual_seed(100 + len(name))
    e = torch.randint(f.emin - f.p - 3, min(f.emax + 2, 127) + 1, (20000,), generator=g)
    x = torch.ldexp(1 + torch.rand(20000, generator=g, dtype=F64), e) * torch.where(
        torch.rand(20000, generator=g) < 0.5, -1.0, 1.0).to(F64)
    # Values a hair off a format tie: float64 -> float32 lands on the tie (the double rounding).
    y = round_nearest(f32_values(g, 2000, f.emin, min(f.emax - 1, 126)), f)
    near_ties = y + torch.copysign(f.ulp(y), y) * (0.5 + 2.0**-40)
    x = torch.cat([x, near_ties, edges(name)])
    assert_same(torch_cast(x, f), x.to(f.torch_dtype).double(), f"torch_cast {name}")


def test_tf32_is_float32_range_with_11_bit_precision() -> None:
    g = torch.Generator().manual_seed(7)
    x32 = torch.cat([f32_values(g, 20000, -150, 128), edges("float32")]).float()
    finite = torch.isfinite(x32)
    # Direct: round-to-nearest-even on the float32 bit pattern, dropping the 13 low mantissa bits.
    b = x32[finite].view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    r = (b + 0xFFF + ((b >> 13) & 1)) & ~0x1FFF & 0xFFFFFFFF
    direct = torch.where(r >= 2**31, r - 2**32, r).to(torch.int32).view(torch.float32).double()
    got = round_nearest(x32.double(), "tf32")
    assert_same(got[finite], direct, "tf32")
    assert_same(got[~finite], x32[~finite].double(), "tf32 non-finite")
    assert FORMATS["tf32"].max == FORMATS["float32"].max * (1 - 2**-11) / (1 - 2**-24)


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32"])
def test_flush_to_zero(name: str) -> None:
    f = FORMATS[name]
    g = torch.Generator().manual_seed(9)
    x = torch.cat([f32_values(g, 5000, f.emin - f.p - 2, f.emin + f.p), edges(name)])
    plain, ftz = round_nearest(x, f), round_nearest(x, f, ftz=True)
    below = x.abs() < f.tiny
    assert below.sum() > 1000 and (~below).sum() > 1000
    assert (ftz[below] == 0).all()
    assert_same(torch.signbit(ftz[below]).double(), torch.signbit(x[below]).double(), "ftz sign")
    assert_same(ftz[~below], plain[~below], "ftz normals")
    assert_same(Numerics("none", ftz=True).round(x, f), ftz, "Numerics(ftz)")


@pytest.mark.parametrize("name,value", [("float16", 1 + 0.3 * 2**-10), ("bfloat16", -3.7), ("float32", 0.1),
                                        ("float16", 1.3 * 2.0**-24)])  # the last one subnormal
def test_stochastic_rounding_picks_neighbours_and_is_unbiased(name: str, value: float) -> None:
    f = FORMATS[name]
    n = 40000
    x = torch.full((n,), value, dtype=F64)
    lo = torch.copysign(torch.floor(x.abs() / f.ulp(x)) * f.ulp(x), x)[0].item()
    hi = lo + math.copysign(f.ulp(x)[0].item(), value)
    gen = torch.Generator().manual_seed(3)
    for y in (round_stochastic(x, f, gen), Numerics("stochastic", seed=4).round(x, f)):
        assert set(y.unique().tolist()) == {lo, hi}
        frac = (value - lo) / (hi - lo)
        sigma = abs(hi - lo) * math.sqrt(frac * (1 - frac) / n)
        assert abs(y.mean().item() - value) < 4 * sigma
    exact = torch.tensor([1.0, 0.5, -2.0], dtype=F64)
    assert torch.equal(round_stochastic(exact, f, gen), exact)  # representable values never move


def test_mca_spreads_and_is_reproducible_by_seed() -> None:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(512, generator=g, dtype=F64) * 100
    def replays(seed: int) -> torch.Tensor:
        num = Numerics("mca", replays=16, seed=seed)
        return num.sum(num.round(num.expand(x) * 1.1, "float32"))  # (16,)
    a, b, c = replays(0), replays(0), replays(1)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert a.unique().numel() > 4  # the replays spread
    exact = (x * 1.1).sum().item()
    assert (a - exact).abs().max().item() < 1e-4 * x.abs().sum().item()
    # One perturbation is at most half an ulp of the virtual precision: a perturbed value stays
    # within one ulp of the format of the exact one.
    pert = perturb_mca(x, "float16", torch.Generator().manual_seed(0))
    assert ((pert - x).abs() <= FORMATS["float16"].ulp(x) / 2).all() and not torch.equal(pert, x)


def _f32_tree(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1]
    w = 1 << max(0, (n - 1).bit_length())
    x = torch.nn.functional.pad(x, (0, w - n))
    while x.shape[-1] > 1:
        h = x.shape[-1] // 2
        x = x[..., :h] + x[..., h:]  # float32 adds
    return x[..., 0]


def _sum_data(seed: int, rows: int = 3, n: int = 1000) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-12, 12, (rows, n), generator=g).double())
    return (torch.randn(rows, n, generator=g, dtype=F64) * mag).float()  # (rows, n) float32


def test_sequential_sum_is_a_float32_loop() -> None:
    x = _sum_data(1)
    s = x[:, 0].clone()
    for i in range(1, x.shape[1]):
        s = s + x[:, i]  # float32 adds, one rounding each
    got = Numerics().sum(x.double(), order="sequential")
    assert_same(got, s.double(), "sequential")
    assert not torch.equal(got, x.double().sum(-1))  # rounding happened


@pytest.mark.parametrize("n", [1000, 1024, 7, 1])
def test_pairwise_sum_is_a_float32_tree(n: int) -> None:
    x = _sum_data(2, n=n)
    assert_same(Numerics().sum(x.double(), order="pairwise"), _f32_tree(x).double(), "pairwise")


@pytest.mark.parametrize("n,lanes", [(1000, 256), (1000, 32), (100, 256), (4096, 1024)])
def test_blocked_sum_is_strided_lanes_then_a_tree(n: int, lanes: int) -> None:
    x = _sum_data(3, n=n)
    w = min(lanes, n)
    steps = -(-n // w)
    xp = torch.nn.functional.pad(x, (0, steps * w - n)).reshape(x.shape[0], steps, w)
    s = xp[:, 0]
    for i in range(1, steps):
        s = s + xp[:, i]  # each lane in sequence, float32
    want = _f32_tree(s)
    assert_same(Numerics().sum(x.double(), order="blocked", lanes=lanes), want.double(), "blocked")
    inv = torch.tensor(1 / n, dtype=torch.float32)  # CUDA's mean: the fp32 sum times fp32(1/n)
    assert_same(Numerics().mean(x.double(), order="blocked", lanes=lanes), (want * inv).double(), "mean")


def test_order_noise_permutes_reductions_by_seed() -> None:
    x = _sum_data(4, rows=1)[0].double()  # (1000,)
    def replays(seed: int) -> torch.Tensor:
        num = Numerics("order", replays=16, seed=seed)
        return num.sum(num.expand(x))
    a, b, c = replays(0), replays(0), replays(5)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.unique().numel() > 2
    assert torch.equal(round_nearest(a, "float32"), a)  # every outcome is a float32 value
    assert (a - x.sum()).abs().max() < 1e-5 * x.abs().sum()


def test_matmul_chunk_one_is_sequential_float32_accumulation() -> None:
    g = torch.Generator().manual_seed(12)
    a = torch.randn(5, 40, generator=g).half()
    b = torch.randn(40, 3, generator=g).half()
    s = torch.zeros(5, 3)
    for i in range(40):
        s = s + a[:, i:i + 1].float() * b[i:i + 1, :].float()  # exact products, float32 accumulation
    got = Numerics().matmul(a.double(), b.double(), out="float16", chunk=1)
    assert_same(got, s.half().double(), "matmul chunk=1")


def test_max_propagates_nan_and_ulps_between() -> None:
    x = torch.tensor([[1.0, math.nan, 3.0], [1.0, 2.0, -math.inf]], dtype=F64)
    m = Numerics().max(x)
    assert math.isnan(m[0].item()) and m[1].item() == 2.0
    u = ulps_between(torch.tensor([1 + 2**-10, math.inf, math.nan, 5.0], dtype=F64),
                     torch.tensor([1.0, math.inf, math.nan, math.nan], dtype=F64), "float16")
    assert u.tolist() == [1.0, 0.0, 0.0, math.inf]


def test_mca_leaves_representable_values_alone() -> None:
    """Verificarlo's random-rounding mode perturbs only results that are inexact at the virtual
    precision: an exact float16 1024.0 (or a subnormal on float16's grid) must come back as itself in
    every replay, where perturbing first moved 1024.0 to 1023.5 in a quarter of them. An inexact value
    still takes both neighbours, and a lower virtual precision perturbs what it cannot hold."""
    f16 = FORMATS["float16"]
    exact = torch.tensor([1024.0, -1024.0, 0.5, 1.0 + 2**-10, 65504.0, 2.0**-24, -3 * 2.0**-24, 2.0**-14], dtype=F64)
    num = Numerics("mca", replays=4000, seed=3)
    out = num.round(num.expand(exact), f16)  # (4000, 8)
    assert torch.equal(out, exact.expand_as(out))
    assert torch.equal(perturb_mca(exact, f16, torch.Generator().manual_seed(1)), exact)
    tie = torch.full((4000,), 1.0 + 2**-11, dtype=F64)  # halfway between two float16 neighbours
    assert set(Numerics("mca", seed=2).round(tie, f16).unique().tolist()) == {1.0, 1.0 + 2**-10}
    low = Numerics("mca", seed=2, mca_precision=8).round(torch.full((4000,), 1.0 + 2**-10, dtype=F64), f16)
    assert low.unique().numel() > 1  # 1 + 2^-10 needs 11 bits: inexact at a virtual precision of 8


def test_mean_multiplies_by_a_float32_reciprocal_as_cuda_does(monkeypatch) -> None:
    """CUDA's torch.mean is acc * factor with factor = float(outputs) / numel in float32
    (ReduceMomentKernel.cu mean_kernel_impl, MeanOps::project), not acc / n as the CPU divides: over
    rows of n = 3000 the twin's mean is fp32(s * fp32(1/3000)), which parts from fp32(s / 3000) on
    some rows. The factor counts one input's means (a replay dim is not rows): past 2^24 elements
    fp32(numel) can round, so 4097 rows of 4097 take a factor one ulp off fp32(1/4097)."""
    x = _sum_data(5, rows=64, n=3000)  # (64, 3000) float32
    s = Numerics().sum(x.double(), order="cuda", outputs=64).float()  # (64,) the fp32 sums, in the mean's order
    inv = torch.tensor(1 / 3000, dtype=torch.float32)
    got = Numerics().mean(x.double())
    assert_same(got, (s * inv).double(), "mean")
    assert (got != (s / 3000).double()).any()
    assert cuda_mean_factor(64, 3000) == float(inv)
    f32 = lambda v: torch.tensor(v, dtype=torch.float64).float()
    assert cuda_mean_factor(4097, 4097) == float(f32(4097) / f32(4097 * 4097)) != float(f32(1 / 4097))
    seen = []
    monkeypatch.setattr(numerics, "cuda_mean_factor", lambda rows, n: seen.append((rows, n)) or float(inv))
    num = Numerics("stochastic", replays=3, seed=1)
    assert num.mean(num.expand(x.double()), keepdim=True).shape == (3, 64, 1) and seen == [(64, 3000)]


def test_replay_draws_are_each_replays_row_by_row_torch_draws(monkeypatch) -> None:
    """ReplayDraws draws a long per-replay draw row by row and cuts short ones from blocks of each
    replay's stream drawn ahead (one generator call per replay per block, not per draw). The numbers
    must be the row-by-row torch draws of the replay's own generator (`random_(0, high)`, `uniform_()`
    of float64, seeded replay_seed(seed, replay)) bit for bit: short draws served from a block, draws
    crossing a block's end, long draws after a block's leftovers, whatever the thresholds and block
    sizes (they change only what is thrown away)."""
    seed, first, count = 11, 3, 4
    sizes = [1, 5, 300, 7, 2, 4096, 3, 9000, 64, 255, 256, 1, 5000, 17, 1500, 1, 1024, 1023]  # per replay, in sequence
    kinds = ["int29", "u", "int42", "int50", "u", "int42", "u", "int29", "u", "int45", "int42", "u", "u", "int49",
             "int62", "u", "u", "int28"]

    def expected() -> list[torch.Tensor]:
        gens = [torch.Generator().manual_seed(numerics.replay_seed(seed, first + i)) for i in range(count)]
        out = []
        for k, kind in zip(sizes, kinds):
            t = torch.empty((count, k), dtype=torch.float64 if kind == "u" else torch.int64)
            for row, g in zip(t, gens):
                row.uniform_(generator=g) if kind == "u" else row.random_(0, 1 << int(kind[3:]), generator=g)
            out.append(t)
        return out

    def drawn() -> list[torch.Tensor]:
        d = numerics.ReplayDraws(seed, first, count, torch.Generator().manual_seed(seed))
        return [numerics._uniform(d, (count, k), torch.device("cpu")) if kind == "u"
                else numerics._integers(d, 1 << int(kind[3:]), (count, k), torch.device("cpu"))
                for k, kind in zip(sizes, kinds)]

    want = expected()
    for long, lo, hi, cap in ((1024, 256, 2048, 1 << 25), (1, 256, 2048, 1 << 25), (10**6, 1, 1, 1 << 25),
                              (300, 3, 50, 1 << 25), (10**6, 10_000, 10_000, 1 << 25), (2000, 256, 4096, 8 * count * 5),
                              (10**6, 256, 4096, 0)):
        monkeypatch.setattr(numerics.ReplayDraws, "LONG", long)
        monkeypatch.setattr(numerics.ReplayDraws, "AHEAD_MIN", lo)
        monkeypatch.setattr(numerics.ReplayDraws, "AHEAD_MAX", hi)
        monkeypatch.setattr(numerics.ReplayDraws, "AHEAD_BYTES", cap)
        got = drawn()
        assert all(g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want)), (long, lo, hi, cap)
    monkeypatch.undo()
    d = numerics.ReplayDraws(seed, first, count, torch.Generator())  # empty draws take nothing; any shape
    assert numerics._uniform(d, (count, 3, 0), torch.device("cpu")).shape == (count, 3, 0)
    assert torch.equal(numerics._integers(d, 1 << 29, (count,), torch.device("cpu")), want[0][:, 0])
    assert torch.equal(numerics._uniform(d, (count, 5, 1), torch.device("cpu")), want[1].view(count, 5, 1))
    # a draw without the replay dim comes from the shared generator, and leaves the streams alone
    d = numerics.ReplayDraws(seed, first, count, torch.Generator().manual_seed(seed))
    shared = numerics._uniform(d, (), torch.device("cpu"))
    assert torch.equal(shared, torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    assert torch.equal(numerics._integers(d, 1 << 29, (count, 1), torch.device("cpu")), want[0])
    for bad in (1 << 27, 3 << 40, 1 << 63):  # torch draws one word below 2^28; 2^63 is past int64
        with pytest.raises(ValueError, match="power of two"):
            numerics._integers(d, bad, (count, 2), torch.device("cpu"))
