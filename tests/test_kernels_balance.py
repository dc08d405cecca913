"""Balanced launches (_common.BALANCED): rows claimed one at a time by persistent programs
(_common.claim_row) give the static loop's y and sketch, leave the workspace (claim counter
included) ready for the next launch, and cover every row exactly once; without the sketch a
program per row gives the same y. Interpreter (TRITON_INTERPRET=1), 2 programs.

    python -m pytest -q tests/test_kernels_balance.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest
import torch

from optwin.ingest.sketch import sketch as ingest_sketch
from optwin.kernels._common import balance_plan
from optwin.kernels.sketch_buffer import new_buffer, read_sketch, workspace


def _rows(n_rows: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_rows, n, generator=g) * torch.logspace(-1, 1, n_rows)[:, None]
    x[5 % n_rows, 3] = float("nan")
    x[(n_rows - 1) if n_rows < 21 else 20, 7] = float("inf")
    return x.to(torch.bfloat16), torch.randn(n, generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("n_rows,n", [(37, 300), (3, 64), (64, 1000)])
def test_claimed_rows_give_the_static_loops_output_and_sketch(n_rows, n):
    from optwin.kernels.rmsnorm import EPS, _rmsnorm_launch

    x, w = _rows(n_rows, n, n_rows)
    out = {}
    for bal in (False, True):
        y, buf = torch.empty_like(x), new_buffer("rmsnorm", x.device)
        _rmsnorm_launch(x, w, y, buf, EPS, balance=bal)
        out[bal] = (y, read_sketch("rmsnorm", buf))
        assert workspace("rmsnorm", x.device)[1].tolist() == [0] * 8  # ticket, counts, claim counter reset
    assert torch.equal(out[True][0].view(torch.int16), out[False][0].view(torch.int16))
    assert out[True][1] == pytest.approx(out[False][1], rel=1e-6)
    want = ingest_sketch("rmsnorm", {"x": x, "weight": w})
    assert out[True][1]["nonfinite"] == want["nonfinite"] == 2
    assert out[True][1]["rms"] == pytest.approx(want["rms"], rel=1e-5)


def test_every_row_is_written_once_by_claims():
    """A row the claims skipped would keep the poison; one claimed twice is harmless for y, so the
    sketch's row count (sum of squares over rows) is checked too."""
    from optwin.kernels.rmsnorm import EPS, _rmsnorm_launch

    x = torch.ones(41, 128, dtype=torch.float32)
    w = torch.ones(128)
    y = torch.full_like(x, float("nan"))
    buf = new_buffer("rmsnorm", x.device)
    _rmsnorm_launch(x, w, y, buf, EPS, balance=True, per_sm=3)  # 6 programs claim 35 rows
    assert not torch.isnan(y).any()
    assert read_sketch("rmsnorm", buf)["rms"] == pytest.approx(1.0)  # sum of squares / numel: each row once


def test_balance_plan_is_a_program_per_row_without_the_sketch():
    assert balance_plan("rmsnorm", 16384, sketch=False, balance=True)[1] is False
    assert balance_plan("rmsnorm", 16384, sketch=False, balance=True)[0] > 1 << 16
    assert balance_plan("rmsnorm", 16384, sketch=True, balance=True) == (None, True)
    assert balance_plan("rmsnorm", 16384, sketch=True, balance=False) == (None, False)
