"""softmax sketch layout 10 (x read as words of two 16-bit elements) under TRITON_INTERPRET=1: the
sketch against optwin.ingest.sketch, y bit-identical to the kernel without the sketch, and which
inputs take the layout.

    python -m pytest -q tests/test_kernels_softmax_packed.py
"""

from __future__ import annotations

import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest
import torch
from _kernel_checks import close, seed, softmax_layout

from optwin.errors import InputError
from optwin.ingest import sketch as ingest_sketch
from optwin.kernels.packed16 import packable
from optwin.kernels.sketch_buffer import new_buffer
from optwin.kernels.softmax import _softmax_launch
from optwin.kernels.softmax_window import windowed

DT = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _masked_rows(n_rows: int, n: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Finite rows of several scales with -inf masks, fully masked rows, a positive-only row."""
    x = torch.randn(n_rows, n, generator=g) * torch.logspace(-1, 2, n_rows)[:, None]
    x[::5, : n // 3] = -math.inf
    x[2] = -math.inf
    x[n_rows - 1] = -math.inf
    x[4] = x[4].abs() + 1.0
    x[4, ::2] = -math.inf
    x[6, :] = -math.inf
    x[6, n // 2] = -2.5  # one finite entry: range 0, entropy 0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(41, 300), (37, 1024), (40, 16), (9, 2), (18, 16384)])
def test_packed_layout_matches_ingest(dtype, shape):
    """Many rows per program (the 16-bit lane counters flushed every FLUSH rows), padded and exact
    widths (16384: the tensor cores' squares on the GPU, 16 words a lane): the sketch is ingest's, y
    the kernel's without the sketch (which reads elements, not words)."""
    x = _masked_rows(*shape, DT[dtype], seed("packed-fast", shape, dtype))
    got, same = softmax_layout(x, 10)
    assert same
    want = ingest_sketch("softmax", {"x": x})
    assert got["masked_rows"] == want["masked_rows"] >= 2 and got["nonfinite"] == 0
    close(got, want)


def test_packed_layout_hf_masks_and_lowest_value_rows():
    """HF's eager masks (finfo.min, whose square overflows float32: the HUGE branch re-reads the
    row), a fully finfo.min row next to -inf (its max is the lowest value: e at -inf must stay 0,
    the clamped branch), one of finfo.min alone, and a row whose range overflows float32 (peaked:
    its t must not be NaN), and a HUGE value that is not a mask beside -inf."""
    g = seed("packed-hf")
    lo = torch.finfo(torch.bfloat16).min
    x = torch.randn(24, 128, generator=g)
    x[1, 60:] = lo  # a causal-style HF row
    x[3] = lo
    x[3, :7] = -math.inf  # max = finfo.min with -inf beside it
    x[5] = lo  # fully HF-masked
    x[7, :10] = -math.inf
    x[7, 10:40] = lo
    x[9, 0], x[9, 3] = 3e38, -3e38  # the range overflows float32: d = -inf at -3e38 (the clamped branch)
    x[11, 5], x[11, 9:20] = 1e30, -math.inf  # a HUGE value beside -inf: its squares from wd
    x[13], x[13, 40:90] = -1e9 + x[13], -math.inf  # a max just above NEG_SAFE (-2^31): -inf read as -2^32, e = 0
    x[15], x[15, 2:30] = -5e9 + x[15], -math.inf  # a max below NEG_SAFE: the clamped branch re-reads the row
    xb = x.to(torch.bfloat16)
    got, same = softmax_layout(xb, 10)
    assert same
    want = ingest_sketch("softmax", {"x": xb})
    assert want["peaked_frac"] > 0
    close(got, want)
    y = torch.empty_like(xb)
    _softmax_launch(xb, y, new_buffer("softmax", "cpu"))
    torch.testing.assert_close(y.float(), torch.softmax(xb.double(), -1).float(), atol=2e-2, rtol=0)
    assert (y[3, :7] == 0).all()  # the -inf beside a row of the lowest value
    assert (y[13, 40:90] == 0).all() and (y[15, 2:30] == 0).all()  # -inf beside very negative maxima


@pytest.mark.parametrize("huge", [2.0**56, 1e20, 1e30, 3e38])
def test_huge_rows_count_the_lowest_value_but_not_minus_inf(huge):
    """In the HUGE branch the squares come from wd, whose -inf halves read as -2^32: their scaled squares
    must vanish in the row's sum, even beside the smallest HUGE value (2^56) alone. A HUGE value far below
    the lowest's square (1e20) beside many -inf and a few real lowest values must keep its share of the sum
    of squares; lanes holding both must count each right (the rms within 1e-6 of ingest's). A negative one
    beside HF's mask (whose halves the loop counts rather than squares) keeps its share too."""
    g = seed("packed-huge", huge)
    lo = torch.finfo(torch.bfloat16).min
    x = torch.randn(12, 256, generator=g)
    x[0, 3], x[0, 8:200] = huge, -math.inf  # no lowest value: the rms is the HUGE value's
    x[1, 3], x[1, 8:200], x[1, 201:203] = huge, -math.inf, lo  # two real lowest values among -inf
    x[2, ::2], x[2, 1::4] = -math.inf, lo  # -inf and lowest interleaved: every lane holds both
    x[3, 3], x[3, 4:] = huge, lo  # an HF-masked row with a HUGE value, no -inf
    x[4, 3], x[4, 10:] = -huge, lo  # a HUGE negative value beside HF's mask: its plain square (the exact pass
    # where that overflows), the mask's counted
    x[5, 0], x[5, 1:] = huge, -math.inf  # one HUGE value, the rest -inf
    xb = x.to(torch.bfloat16)
    for rows in (xb, xb[:6]):  # all rows in one program's lane sums, and a launch of HUGE rows only
        got, same = softmax_layout(rows, 10)
        assert same
        want = ingest_sketch("softmax", {"x": rows})
        close(got, want)
        assert math.isclose(got["rms"], want["rms"], rel_tol=1e-6)
    single, _ = softmax_layout(xb[:1], 10)
    assert math.isclose(single["rms"], float(xb[0, 3]) / 8, rel_tol=1e-6)  # over the 64 entries not -inf


def test_packed_layout_fp16_lowest_value_next_to_minus_inf():
    """fp16's lowest finite value (-65504, fp16 HF masks) as a row max next to -inf: the -inf halves
    read as that value would give e = 1; the row takes the clamped branch."""
    x = torch.full((4, 64), -65504.0)
    x[0, :5] = -math.inf
    x[1, :] = torch.linspace(-65000, -64000, 64)
    x[1, ::3] = -math.inf
    xh = x.to(torch.float16)
    got, same = softmax_layout(xh, 10)
    assert same
    close(got, ingest_sketch("softmax", {"x": xh}))
    y = torch.empty_like(xh)
    _softmax_launch(xh, y, None)
    assert (y[0, :5] == 0).all() and (y[1, ::3] == 0).all()


def test_packed_layout_slow_rows_redo_the_program():
    """NaN and +inf make the lane sums non-finite: the program re-reads its rows for exact statistics."""
    g = seed("packed-slow")
    x = torch.randn(40, 200, generator=g) * 10
    x[1, 17] = float("nan")
    x[2, 3] = float("inf")
    x[4] = -math.inf
    x[4, 9] = float("nan")
    x[11, :] = -math.inf
    xb = x.to(torch.bfloat16)
    got, same = softmax_layout(xb, 10)
    assert same
    assert got["nonfinite"] == 3 and got["masked_rows"] == 1
    close(got, ingest_sketch("softmax", {"x": xb}))


def test_which_inputs_take_the_packed_layout():
    """16-bit rows of even length with an even row stride and 4-byte alignment read as words, and so do
    odd-length rows of 16 or more read through their aligned vectors (softmax_window.windowed); the rest keep
    layout 4 (asking for layout 10 there is a clear error)."""
    x = torch.randn(6, 32).to(torch.bfloat16)
    assert packable(x) and packable(x.to(torch.float16))
    assert not packable(x.float())
    assert not packable(x[:, :31])  # odd length
    assert not packable(torch.randn(6, 33).to(torch.bfloat16)[:, 1:])  # odd stride
    assert not packable(x.reshape(-1)[1:97].reshape(3, 32))  # 2-byte offset
    odd = torch.randn(5, 31).to(torch.bfloat16)
    assert windowed(odd, torch.empty_like(odd), 1) and not windowed(x, x, 2)
    _softmax_launch(odd, torch.empty_like(odd), new_buffer("softmax", "cpu"), variant=10)  # its whole vectors' words
    for t, kw in ((odd, {"window": False}), (odd[:, :15].contiguous(), {})):  # element by element; too short
        with pytest.raises(InputError, match="layout 10"):
            _softmax_launch(t, torch.empty_like(t), new_buffer("softmax", "cpu"), variant=10, **kw)
    short, odd_stride = odd[:, :15].contiguous(), torch.randn(6, 33).to(torch.bfloat16)[:, 1:]
    for t in (short, x.float(), odd_stride):  # the default: layout 4
        got, same = softmax_layout(t, None)
        assert same
        close(got, ingest_sketch("softmax", {"x": t}))


@pytest.mark.parametrize("probe", [1, 2, 4, 8, 16, 32, 63, 127, 159, 256, 543, 1055, 2079])
def test_bench_probes_leave_y_bit_identical(probe):
    """The kernel's PROBE bits (bench only) leave parts of the sketch out to time them; y must stay the
    kernel's, or the timings compare different work."""
    x = _masked_rows(13, 300, torch.bfloat16, seed("packed-probe", probe))
    y0, y = torch.empty_like(x), torch.full_like(x, float("nan"))
    _softmax_launch(x, y0, None)
    _softmax_launch(x, y, new_buffer("softmax", x.device), probe=probe)
    assert torch.equal(y.view(torch.int16), y0.view(torch.int16))
