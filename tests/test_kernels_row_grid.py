"""One program per row for the launches without the sketch that _common.ROW_GRID lists: the grid
never changes y (each row is one program's tree either way), the sketched launch stays persistent,
and the bench's per_sm still overrides. Interpreter (TRITON_INTERPRET=1).

    python -m pytest -q tests/test_kernels_row_grid.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest
import torch

from optwin.kernels._common import (
    ROW_GRID,
    ROW_PER_PROGRAM,
    grid_per_sm,
    persistent_grid,
)


def test_grid_is_a_program_per_row_only_without_the_sketch():
    for op, block in ROW_GRID:
        assert grid_per_sm(op, block, sketch=False) == ROW_PER_PROGRAM
        assert persistent_grid(("k",), 4096, torch.device("cpu"), ROW_PER_PROGRAM) == 4096
        assert grid_per_sm(op, block, sketch=True) is None  # the occupancy's persistent grid
        assert grid_per_sm(op, block, sketch=False, per_sm=3) == 3  # the bench's override
    assert grid_per_sm("rmsnorm", 1024, sketch=False) is None  # not measured: persistent


def _launch(op: str, x: torch.Tensor, y: torch.Tensor, per_sm: int | None) -> None:
    g = torch.Generator().manual_seed(1)
    n = x.shape[1]
    if op == "rmsnorm":
        from optwin.kernels.rmsnorm import EPS, _rmsnorm_launch

        _rmsnorm_launch(x, torch.randn(n, generator=g).to(x.dtype), y, None, EPS, per_sm=per_sm)
    elif op == "layernorm":
        from optwin.kernels.layernorm import EPS, _layernorm_launch

        w, b = torch.randn(n, generator=g).to(x.dtype), torch.randn(n, generator=g).to(x.dtype)
        _layernorm_launch(x, w, b, y, None, EPS, per_sm=per_sm)
    else:
        from optwin.kernels.softmax import _softmax_launch

        _softmax_launch(x, y, None, per_sm=per_sm)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "softmax"])
def test_a_program_per_row_writes_the_persistent_loops_y(op):
    x = (torch.randn(5, 16384, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    assert (op, 16384) in ROW_GRID
    rows, persistent = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    _launch(op, x, rows, None)  # ROW_GRID: 5 programs
    _launch(op, x, persistent, 1)  # 2 programs (the interpreter's 2 SMs), rows pid, pid + 2, ...
    assert not torch.isnan(rows.float()).any()
    assert torch.equal(rows.view(torch.int16), persistent.view(torch.int16))
