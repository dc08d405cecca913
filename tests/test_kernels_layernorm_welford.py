"""layernorm's Welford kernel (the rows twin.numerics.welford_chunk takes): the interpreter runs the
twin's merge tree, so y is the twin's bit for bit in float32; the sketch in row records matches
ingest's with NaN, ±inf, overflowing, constant and near-constant rows across the finisher's poll
boundaries; y is the same with and without the sketch; the records go back to the sentinel.
Interpreter (TRITON_INTERPRET=1).

    python -m pytest -q tests/test_kernels_layernorm_welford.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import numpy as np
import pytest
import torch

from optwin import twin
from optwin.errors import InputError
from optwin.ingest.sketch import sketch as ingest_sketch
from optwin.kernels.layernorm import EPS, _layernorm_launch, layernorm
from optwin.kernels.sketch_buffer import (
    SENTINEL,
    SLOTS,
    new_buffer,
    read_sketch,
    row_records,
    workspace,
)
from optwin.twin.layernorm import EPS32, welford
from optwin.twin.numerics import (
    Numerics,
    fma_odd,
    round_nearest,
    welford_chunk,
)


def _inputs(rows: int, n: int, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": (torch.randn(rows, n, generator=g) * 2 + 0.5).to(dtype),
            "weight": (1 + 0.1 * torch.randn(n, generator=g)).to(dtype),
            "bias": (0.1 * torch.randn(n, generator=g)).to(dtype)}


def _launch(inp: dict[str, torch.Tensor], sketch: bool, **kw) -> tuple[torch.Tensor, dict[str, float] | None]:
    x = inp["x"]
    y, buf = torch.full_like(x, float("nan")), new_buffer("layernorm", x.device).fill_(float("nan")) if sketch else None
    _layernorm_launch(x, inp["weight"], inp["bias"], y, buf, EPS, **kw)
    return y, read_sketch("layernorm", buf) if sketch else None


def test_the_welford_launch_takes_rows_its_chunks_divide_in_three_pieces_or_more():
    rows = (2048, 3072, 4096, 5120, 6144, 7168, 8192, 9000, 12000, 12288, 16384, 65536, 69632)
    assert [welford_chunk(n) for n in rows] == [0, 0, 1024, 1024, 2048, 1024, 2048, 0, 0, 4096, 4096, 4096, 0]
    with pytest.raises(InputError, match="Welford launch takes rows of 4096"):
        _launch(_inputs(2, 100, torch.float32, 0), sketch=False, welford=True)


@pytest.mark.parametrize(("n", "chunk"), [(16384, 4096), (6144, 2048), (5120, 1024), (4096, 1024), (65536, 4096),
                                            (12000, 4096)])
def test_float32_mean_and_variance_are_the_twins_bit_for_bit(n, chunk):
    """y from twin.layernorm.welford's mean and variance, with the interpreter's rsqrt (numpy's 1/sqrt,
    two roundings, where the twin models a correctly rounded rsqrt and the GPU rsqrt.approx) and the
    epilogue's FMA; the twin's own y within 2 ulps of each row's largest |y| (that rsqrt). 12000: a
    ragged last piece (the launch forced; the catalog variant holds such rows in registers); 4096 and
    65536: the smallest and the largest rows the Welford launch takes."""
    inp = _inputs(3, n, torch.float32, n)
    inp["x"][1] += 300.0  # |mean|/std ~ 150: the mean's rounding shows in y
    y, _ = _launch(inp, sketch=False, welford=True, welford_chunk=chunk)
    h = inp["x"].double()
    m, var = welford(Numerics(), h, lanes=chunk)  # float32 values, (rows, 1)
    rs = torch.from_numpy(1 / np.sqrt(var.float().numpy() + np.float32(EPS32)))  # the interpreter's float32 ops
    d = (inp["x"] - m.float()) * rs  # float32, each op rounded
    want = round_nearest(fma_odd(d.double(), inp["weight"].double(), inp["bias"].double()), "float32")  # one FMA
    assert torch.equal(y.double(), want)
    if welford_chunk(n):
        emulated = twin.run("layernorm", "triton", "float32", inp).emulated
        ulp = torch.finfo(torch.float32).eps * emulated.abs().amax(-1, keepdim=True)
        assert float(((y.double() - emulated).abs() / ulp).max()) <= 2.0
    y_persistent, _ = _launch(inp, sketch=False, welford=False)  # the row-in-registers kernel: other numerics
    assert not torch.equal(y, y_persistent)


def test_a_constant_row_normalizes_to_the_bias():
    """Welford keeps a constant row's mean exact (every delta is 0) and M2 = 0: y = b exactly."""
    inp = _inputs(2, 5120, torch.float32, 4)
    inp["x"][0] = 1234.5
    y, s = _launch(inp, sketch=True)
    assert torch.equal(y[0], inp["bias"])
    assert s["const_absmax"] == 1234.5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_sketch_matches_ingest_with_flagged_rows_across_polls(dtype):
    """Rows with NaN, ±inf, an fp32-square overflow, a constant and a near-constant row take the
    flagged path (exact partials merged into the workspace, the flag released after them), on both
    sides of 4-row polls; the max |x| runs packed (two bf16 an instruction) or in fp32. The finisher
    leaves the workspace at its identities, ready for the next launch."""
    inp = _inputs(11, 6144, dtype, 7)
    x = inp["x"]
    x[1, 5], x[3, 0], x[4, 6143] = float("nan"), float("inf"), -float("inf")
    x[5, 9] = 3e20  # finite; its fp32 square overflows
    x[7] = -96.0  # constant
    x[8] = x[8] * 1e-3 + 1000.0  # near-constant: |mean|/std past 2^16, not constant
    x[10, 3] = -41.0  # the largest |x| of the plain rows, negative
    y, got = _launch(inp, sketch=True, poll=4)
    f, i = workspace("layernorm", x.device)
    assert torch.equal(f[:SLOTS], f[SLOTS:]) and not bool(i.any())
    y0, _ = _launch(inp, sketch=False)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(y.view(bits), y0.view(bits))
    want = ingest_sketch("layernorm", inp)
    assert got["nonfinite"] == want["nonfinite"] == 3
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-6, abs=1e-30), k
    _, persistent = _launch(inp, sketch=True, welford=False)
    for k, v in persistent.items():  # the persistent kernel takes a near-constant row's ratio from its fp32 sums
        assert got[k] == pytest.approx(v, rel=1e-3 if k == "max_mean_over_std" else 1e-6, abs=1e-30), k
    words, _ = row_records("layernorm", x.device, 11)
    assert bool((words == SENTINEL).all())  # every word the launch used is back at the sentinel


def test_the_public_function_routes_the_rows_to_it():
    inp = _inputs(2, 12288, torch.float16, 9)
    y, buf = layernorm(inp["x"], inp["weight"], inp["bias"])
    y_forced, _ = _launch(inp, sketch=False, welford=True)
    assert torch.equal(y.view(torch.int16), y_forced.view(torch.int16))
    assert read_sketch("layernorm", buf)["rows"] == 2
