"""Row alignment the launchers declare to Triton (_common.column_multiple, _common.aligned): the multiple
computed from the row length and strides, and y and the sketch unchanged by it, on rows and strided
views whose multiple is 8, 4, 2 or 1 (the interpreter runs v // ALIGN * ALIGN as written). What it buys
(vector loads where 16 does not divide the row) is compiled code: tests/test_kernels_offline.py.

    python -m pytest -q tests/test_kernels_align.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest
import torch

from optwin.kernels import layernorm, rmsnorm, softmax
from optwin.kernels._common import column_multiple
from optwin.kernels.sketch_buffer import read_sketch


def test_column_multiple_is_the_largest_power_of_two_up_to_16_dividing_all():
    assert column_multiple(16384, 16384, 16384) == 16
    assert column_multiple(9000, 9000, 9000) == 8
    assert column_multiple(9000, 9008, 9000) == 8
    assert column_multiple(200, 264, 200) == 8
    assert column_multiple(300, 300) == 4
    assert column_multiple(9001, 9001) == 1
    assert column_multiple(4096, 0, 4096) == 16  # a stride of 0 (one row, broadcast) constrains nothing


def _run(op: str, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    n = x.shape[-1]
    w = torch.linspace(0.5, 1.5, n).to(x.dtype)
    if op == "softmax":
        y, buf = softmax.softmax(x)
    elif op == "rmsnorm":
        y, buf = rmsnorm.rmsnorm(x, w)
    else:
        y, buf = layernorm.layernorm(x, w, torch.linspace(-0.1, 0.1, n).to(x.dtype))
    return y, read_sketch(op, buf)


@pytest.mark.parametrize("op", ["softmax", "rmsnorm", "layernorm"])
@pytest.mark.parametrize("width, keep", [(264, 200), (1000, 1000), (300, 300), (258, 250), (97, 97)])
def test_declared_alignment_changes_neither_y_nor_the_sketch(op, width, keep):
    """A row view of `keep` columns in rows of `width` (stride width): y and the sketch equal those of
    the same values made contiguous, whose multiple differs (e.g. 200 of 264: 8 against 8; 250 of 258: 2)."""
    g = torch.Generator().manual_seed(width * 7 + keep)
    base = (torch.randn(19, width, generator=g) * 3).to(torch.bfloat16)
    base[3, 5] = -float("inf") if op == "softmax" else 7.0
    view = base[:, :keep]
    dense = view.contiguous()
    y_view, s_view = _run(op, view)
    y_dense, s_dense = _run(op, dense)
    assert torch.equal(y_view.view(torch.int16), y_dense.view(torch.int16))
    assert s_view == s_dense
