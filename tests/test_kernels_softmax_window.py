"""Softmax over rows that no power of two divides, read and written through their aligned 16-byte vectors
(softmax_window.windowed, the kernel's WINDOW): the row's whole vectors in the main tensor, its first and last
partial vectors as edge pieces. Under TRITON_INTERPRET=1: which launches take it, y against float64 and
against the element-by-element launch, y bit-identical with and without the sketch, the sketch against
optwin.ingest with NaN, +inf, -inf and HF masks in the edges, neighbour rows left unwritten. The speed it
buys (vector loads) is compiled code: tests/test_kernels_offline.py and bench/RESULTS.md, stop 33.

    python -m pytest -q tests/test_kernels_softmax_window.py
"""

from __future__ import annotations

import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest
import torch
from _kernel_checks import bits, close, seed

from optwin.ingest import sketch as ingest_sketch
from optwin.kernels.sketch_buffer import new_buffer, read_sketch
from optwin.kernels.softmax import _softmax_launch
from optwin.kernels.softmax_window import windowed

DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units in the last place between two outputs of one dtype (NaN against NaN: 0)."""
    d = (bits(a).long() - bits(b).long()).abs()
    return int(torch.where(a.isnan() & b.isnan(), 0, d).max())


def _launch(x: torch.Tensor, sketch: bool = True, **kw) -> tuple[torch.Tensor, dict[str, float] | None]:
    y = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    buf = new_buffer("softmax", x.device) if sketch else None
    _softmax_launch(x, y, buf, **kw)
    return y, read_sketch("softmax", buf, x.shape) if sketch else None


def _special_rows(x: torch.Tensor) -> torch.Tensor:
    """NaN, +inf, -inf, finite values whose fp32 square overflows and masks, at the rows' first and last
    elements (the edges, where a row does not start on a vector) and inside."""
    n = x.shape[1]
    x[1, 0] = float("nan")
    x[2, -1] = float("inf")
    x[3] = -math.inf  # fully masked
    x[4, :-1] = -math.inf  # one finite entry, in the last edge
    x[5, 1:] = -math.inf  # one finite entry, in the first edge
    x[6, ::2] = -math.inf
    x[7, n // 2] = -math.inf
    return x


def test_which_launches_read_rows_through_their_vectors():
    bf = torch.randn(6, 97).to(torch.bfloat16)
    assert windowed(bf, torch.empty_like(bf), 1)
    assert windowed(bf.float(), torch.empty_like(bf.float()), 1)  # float32 rows of odd length too
    even = torch.randn(6, 96).to(torch.bfloat16)
    assert not windowed(even, torch.empty_like(even), 16)  # aligned: vector loads already
    fp32 = torch.randn(6, 98)
    assert not windowed(fp32, torch.empty_like(fp32), 2)  # 8-byte vectors already; only ALIGN 1 rows
    assert not windowed(bf, torch.empty(6, 98, dtype=torch.bfloat16)[:, :97], 1)  # y's rows elsewhere
    flat = torch.randn(6 * 97 + 1).to(torch.bfloat16)
    assert not windowed(flat[1:].view(6, 97), torch.empty_like(bf), 1)  # x 2 bytes off a 16-byte boundary


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("shape", [(23, 13), (19, 97), (9, 1023), (3, 3), (1, 1025)])
def test_window_rows_match_float64_the_element_launch_and_ingest(dtype, shape):
    """n = 3 (one vector), 13 and 97 (rows straddling vectors), 1023 (the last vector past BLOCK when the
    row starts late in its first vector), one row (offset 0)."""
    g = seed("window", shape, dtype)
    x = torch.randn(*shape, generator=g) * torch.logspace(0, 1.5, shape[0])[:, None]
    if shape[0] > 8:
        x = _special_rows(x)
    x = x.to(DT[dtype])
    assert windowed(x, torch.empty_like(x), 1)
    y, got = _launch(x)
    y0, _ = _launch(x, sketch=False)
    ye, got_e = _launch(x, window=False)  # element by element (layout 4)
    assert torch.equal(bits(y), bits(y0))  # the same lanes, trees and edges with and without the sketch
    ref = torch.softmax(x.double(), -1)
    assert torch.equal(y.isnan(), ref.isnan())  # NaN exactly where float64 has it (NaN, +inf, fully masked rows)
    ulp = {"bfloat16": 2**-8, "float16": 2**-11, "float32": 2**-24}[dtype]
    assert float((y.double() - ref).abs().nan_to_num(0).max()) <= 2 * ulp
    # only the row sum's order differs from the element launch: a few float32 ulps of s, within one ulp of
    # the 16-bit outputs
    assert _ulps(y, ye) <= (8 if dtype == "float32" else 1)
    want = ingest_sketch("softmax", {"x": x})
    close(got, want)
    close(got_e, want)
    if shape[0] > 8:
        assert got["nonfinite"] == 2 and got["masked_rows"] == 1


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("n", [301, 300, 256])
def test_hf_masks_beside_minus_inf_in_window_and_padded_rows(dtype, n):
    """HF's finfo.min masks (bfloat16's square overflows float32: the HUGE branch) with and without -inf
    in the row: 301 reads through its vectors (-inf halves outside them), 300 has padding words, 256 none.
    Each takes the branch that fits (no -inf; -inf only as padding; -inf in the row: a re-read)."""
    g = seed("window-hf", n, dtype)
    lo = torch.finfo(DT[dtype]).min
    x = torch.randn(33, n, generator=g) * 4
    x[:, n // 2:] = lo
    x[3, 5], x[9, -1], x[11, 0] = -math.inf, -math.inf, -math.inf
    x[7, :3] = -math.inf
    x = x.to(DT[dtype])
    y, got = _launch(x)
    y0, _ = _launch(x, sketch=False)
    assert torch.equal(bits(y), bits(y0))
    close(got, ingest_sketch("softmax", {"x": x}))


def test_neighbour_columns_of_window_rows_stay_unwritten():
    """Rows of 95 in rows of 97 (x and y alike): the edges' element stores and the whole-vector stores
    never touch the two columns between rows."""
    base = torch.randn(17, 97, generator=seed("window-gaps")).to(torch.bfloat16)
    ybase = torch.full_like(base, float("nan"))
    x2, y2 = base[:, :95], ybase[:, :95]
    assert windowed(x2, y2, 1)
    buf = new_buffer("softmax", x2.device)
    _softmax_launch(x2, y2, buf)
    assert bool(ybase[:, 95:].isnan().all()) and not bool(y2.isnan().any())
    close(read_sketch("softmax", buf, x2.shape), ingest_sketch("softmax", {"x": x2}))
