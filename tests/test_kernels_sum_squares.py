"""The norms' sum of squares (optwin.kernels._common.sum_squares: each 4 neighbours' squares folded with
explicit FMAs, then a tree) under TRITON_INTERPRET=1 (a true single-rounding fma), bit for bit against
the twin's model of it (optwin.twin.triton_reduce.sum_squares, the path the rmsnorm / layernorm twins take
for rows held whole), on rows where an FMA and a rounded product give different sums.

    python -m pytest -q tests/test_kernels_sum_squares.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest
import torch
import triton
import triton.language as tl
from _kernel_checks import seed

from optwin.kernels._common import sum_squares
from optwin.twin.numerics import TRITON_WHOLE_ROW_MAX, Numerics
from optwin.twin.numerics import sum_squares as chunked_sum_squares
from optwin.twin.triton_reduce import row_layout
from optwin.twin.triton_reduce import sum_squares as twin_sum_squares


@triton.jit
def _sum_squares_rows(X, S, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    tl.store(S + r, sum_squares(tl.load(X + r * BLOCK + tl.arange(0, BLOCK)), BLOCK))


def _kernel(x: torch.Tensor) -> torch.Tensor:
    s = torch.empty(x.shape[0], dtype=torch.float32)
    _sum_squares_rows[(x.shape[0],)](x, s, BLOCK=x.shape[1])
    return s


def _rounded_products(x: torch.Tensor) -> torch.Tensor:
    """The same groups and tree with every product rounded first (the kernels before stop 14)."""
    q = (x * x).reshape(x.shape[0], -1, 4)  # float32: each product rounded
    return ((q[..., 0] + (q[..., 1] + (q[..., 2] + q[..., 3])))).sum(-1)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("width", [4, 8])
def test_kernel_sum_of_squares_is_the_twins_fma_chain(width: int, op: str) -> None:
    """Rows of one or two groups (the tree is then exact or one add, so the interpreter's tl.sum order
    agrees with the device's): kernel == the twin's path (each norm's launch layout) bit for bit, and the
    rows were chosen so that rounding each product first gives another sum."""
    g = seed("sum-squares", width)
    x = (1 + torch.rand(512, width, generator=g) * 2.0**-10).to(torch.float32)  # squares near 1: long tails
    got = _kernel(x).double()
    want = twin_sum_squares(Numerics(), x.double(), *row_layout(width, "float32", op)).squeeze(-1)
    assert torch.equal(got, want)
    differs = _rounded_products(x).double() != want
    assert int(differs.sum()) > 20  # the test can tell an FMA from a rounded product


def test_chunked_sum_squares_refuses_rows_held_whole() -> None:
    """numerics.sum_squares models only rows read in chunks: a row held whole is triton_reduce's to sum,
    and a second model of it would go unchecked (it did: s49 review)."""
    with pytest.raises(ValueError, match="triton_reduce.sum_squares"):
        chunked_sum_squares(Numerics(), torch.ones(2, TRITON_WHOLE_ROW_MAX, dtype=torch.float64))
    n = TRITON_WHOLE_ROW_MAX + 4
    s = chunked_sum_squares(Numerics(), torch.full((2, n), 0.5, dtype=torch.float64))
    assert s.shape == (2, 1) and torch.equal(s, torch.full((2, 1), n / 4, dtype=torch.float64))  # exact
