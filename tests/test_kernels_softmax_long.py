"""softmax over rows longer than a program holds in registers (n > MAX_BLOCK = 65536, a vocabulary's
logits: optwin.kernels.softmax_long) under TRITON_INTERPRET=1: y against the twin's softmax/triton
(sums over TRITON_CHUNK pieces, then across them) and float64, y the same with and without the sketch, and the
sketch equal to optwin.ingest's, also for rows with masks, NaN/±inf and squares past float32.

    python -m pytest -q tests/test_kernels_softmax_long.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest  # noqa: E402
import torch  # noqa: E402
from _kernel_checks import bits, close, seed

from optwin import twin  # noqa: E402
from optwin.ingest import sketch as ingest_sketch  # noqa: E402
from optwin.kernels.sketch_buffer import read_sketch  # noqa: E402
from optwin.kernels.softmax import softmax  # noqa: E402

N = 70001  # past MAX_BLOCK, not a multiple of the chunk: the last piece is partial


def _rows(dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Logit-like rows: plain, -inf masked, HF's finfo.min mask, one peaked, one fully masked."""
    x = (torch.randn(5, N, generator=g) * 3).to(dtype)
    x[1, ::7] = -float("inf")
    x[2, N // 2:] = torch.finfo(dtype).min
    x[3, 123] = 60.0  # nearly all the mass on one entry: a low-entropy row
    x[4] = -float("inf")
    return x


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_long_rows_match_the_twin_and_ingest(dtype):
    x = _rows(dtype, seed("softmax-long", str(dtype)))
    y, buf = softmax(x)
    y0, _ = softmax(x, sketch=False)
    assert torch.equal(bits(y), bits(y0))
    emu = twin.run("softmax", "triton", str(dtype).removeprefix("torch."), {"x": x[:4]}).emulated
    got = y[:4].double()
    # the twin's exp is float64's rounded to float32, the interpreter's numpy's float32 exp: a last bit
    # can differ, so float32 y by a few ulps and, rarely, a float16 y by one
    ulp = torch.finfo(dtype).eps * torch.maximum(got.abs(), emu.abs()).clamp(min=torch.finfo(dtype).tiny)
    assert float(((got - emu).abs() / ulp).max()) <= (1.0 if dtype == torch.float16 else 4.0)
    if dtype == torch.float16:
        assert int((got != emu).sum()) <= 10
    assert bool(y[4].isnan().all())  # a fully masked row: NaN, as torch.softmax gives
    torch.testing.assert_close(got, torch.softmax(x[:4].double(), -1), rtol=2e-3, atol=1e-7)
    s = read_sketch("softmax", buf, x.shape)
    close(s, ingest_sketch("softmax", {"x": x}))
    assert s["masked_rows"] == 1 and s["peaked_frac"] == 0.25  # 1 of the 4 rows with a finite entry


@pytest.mark.parametrize("poison", ["nan", "inf", "huge"])
def test_long_rows_with_special_values_keep_y_and_the_sketch(poison):
    g = seed("softmax-long-special", poison)
    x = torch.randn(3, N, generator=g) * 2
    if poison == "nan":
        x[1, 5] = float("nan")
    elif poison == "inf":
        x[1, 5] = float("inf")
    else:
        x[1, :10] = 3e30  # squares past float32: float64 sums
    y, buf = softmax(x)
    y0, _ = softmax(x, sketch=False)
    torch.testing.assert_close(y, y0, rtol=0, atol=0, equal_nan=True)
    if poison != "huge":
        assert bool(y[1].isnan().all())
    s = read_sketch("softmax", buf, x.shape)
    close(s, ingest_sketch("softmax", {"x": x}))
    assert s["nonfinite"] == (0 if poison == "huge" else 1)


def test_long_rows_to_float32_out():
    """HF's eager attention asks for float32 probabilities of 16-bit scores."""
    x = (torch.randn(2, N, generator=seed("softmax-long-out")) * 4).to(torch.bfloat16)
    y, _ = softmax(x, out_dtype=torch.float32)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), torch.softmax(x.double(), -1), rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(y.sum(-1), torch.ones(2), rtol=1e-5, atol=0)


def test_long_rows_are_the_same_alone_and_in_a_batch():
    """A program per (row, piece): a row's y and sketch do not depend on the rows beside it."""
    x = _rows(torch.bfloat16, seed("softmax-long-batch"))[:4]
    y, _ = softmax(x, sketch=False)
    for r in range(x.shape[0]):
        alone, buf = softmax(x[r:r + 1])
        assert torch.equal(bits(alone[0]), bits(y[r]))
        close(read_sketch("softmax", buf, (1, N)), ingest_sketch("softmax", {"x": x[r:r + 1]}))


def test_long_rows_strided_and_empty():
    x = torch.randn(3, 2 * N, generator=seed("softmax-long-strided"))[:, ::2]  # a column stride of 2
    y, buf = softmax(x)
    torch.testing.assert_close(y.double(), torch.softmax(x.double(), -1), rtol=1e-5, atol=1e-12)
    close(read_sketch("softmax", buf, x.shape), ingest_sketch("softmax", {"x": x}))
    rows = torch.randn(4, N, generator=seed("softmax-long-rows"))[::2]  # a row stride of 2N
    y, buf = softmax(rows)
    torch.testing.assert_close(y.double(), torch.softmax(rows.double(), -1), rtol=1e-5, atol=1e-12)
    close(read_sketch("softmax", buf, rows.shape), ingest_sketch("softmax", {"x": rows}))
    empty = torch.zeros(0, N)
    y, buf = softmax(empty)
    assert y.shape == (0, N)
    s = read_sketch("softmax", buf, empty.shape)
    assert s["rows"] == 0 and s["numel"] == 0 and s["nonfinite"] == 0


def test_rows_past_the_piece_limit_get_a_clear_error():
    from optwin.errors import InputError
    from optwin.kernels.softmax_long import MAX_PIECES

    x = torch.zeros(1, MAX_PIECES * 4096 + 1)
    with pytest.raises(InputError, match="exceed the 16777216 columns"):
        softmax(x)


def test_a_piece_width_sends_shorter_rows_to_the_chunked_kernel():
    """_softmax_launch(piece=...) runs rows that fit in a program through softmax_long (the bench's
    comparison at 32769-65535 wide, where BLOCK 65536 spills): y close to the in-register kernel's (the sum
    order differs) and to float64, y the same without the sketch, the sketch equal to ingest's."""
    from optwin.kernels.sketch_buffer import new_buffer
    from optwin.kernels.softmax import _softmax_launch

    x = (torch.randn(6, 1001, generator=seed("softmax-long-short")) * 3).to(torch.bfloat16)
    x[2, ::5] = -float("inf")
    y, y0, yr = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    buf = new_buffer("softmax", x.device)
    _softmax_launch(x, y, buf, piece=256)  # 4 pieces a row, the last partial
    _softmax_launch(x, y0, None, piece=256)
    _softmax_launch(x, yr, None)  # in registers
    assert torch.equal(bits(y), bits(y0))
    assert float((y.double() - yr.double()).abs().max()) <= 2**-8
    torch.testing.assert_close(y.double(), torch.softmax(x.double(), -1), rtol=1e-2, atol=2**-9)
    close(read_sketch("softmax", buf, x.shape), ingest_sketch("softmax", {"x": x}))
