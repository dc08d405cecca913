"""One program per row for the launches that _common.ROW_GRID (without the sketch) and SKETCH_ROW_GRID
(with it) list: the grid never changes y (each row is one program's tree either way) nor the sketch
(the finisher claimed early or last), and the bench's per_sm still overrides. Interpreter
(TRITON_INTERPRET=1).

    python -m pytest -q tests/test_kernels_row_grid.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest
import torch

from optwin.ingest import sketch as ingest_sketch
from optwin.kernels._common import (
    ROW_GRID,
    ROW_PER_PROGRAM,
    SKETCH_ROW_GRID,
    grid_per_sm,
    persistent_grid,
)
from optwin.kernels.sketch_buffer import SLOTS, SPREAD, WORKSPACE, new_buffer, read_sketch, workspace

from _kernel_checks import close


def test_grid_is_a_program_per_row_where_listed():
    for op, block in ROW_GRID:
        assert grid_per_sm(op, block, sketch=False) == ROW_PER_PROGRAM
        assert persistent_grid(("k",), 4096, torch.device("cpu"), ROW_PER_PROGRAM) == 4096
        want = ROW_PER_PROGRAM if (op, block) in SKETCH_ROW_GRID else None  # None: the occupancy's grid
        assert grid_per_sm(op, block, sketch=True) == want
        assert grid_per_sm(op, block, sketch=False, per_sm=3) == 3  # the bench's override
    assert SKETCH_ROW_GRID <= ROW_GRID
    assert grid_per_sm("rmsnorm", 1024, sketch=False) is None  # not measured: persistent


def _params(op: str, n: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(n, generator=g).to(dtype), torch.randn(n, generator=g).to(dtype)
    return {"weight": w} if op == "rmsnorm" else {"weight": w, "bias": b} if op == "layernorm" else {}


def _launch(op: str, x: torch.Tensor, y: torch.Tensor, per_sm: int | None, buf: torch.Tensor | None = None,
            claim_early: bool = True) -> None:
    p = _params(op, x.shape[1], x.dtype)
    if op == "rmsnorm":
        from optwin.kernels.rmsnorm import EPS, _rmsnorm_launch

        _rmsnorm_launch(x, p["weight"], y, buf, EPS, per_sm=per_sm, claim_early=claim_early)
    elif op == "layernorm":
        from optwin.kernels.layernorm import EPS, _layernorm_launch

        _layernorm_launch(x, p["weight"], p["bias"], y, buf, EPS, per_sm=per_sm, claim_early=claim_early)
    else:
        from optwin.kernels.softmax import _softmax_launch

        _softmax_launch(x, y, buf, per_sm=per_sm)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "softmax"])
def test_a_program_per_row_writes_the_persistent_loops_y(op):
    x = (torch.randn(5, 16384, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    assert (op, 16384) in ROW_GRID
    rows, persistent = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    _launch(op, x, rows, None)  # ROW_GRID: 5 programs
    _launch(op, x, persistent, 1)  # 2 programs (the interpreter's 2 SMs), rows pid, pid + 2, ...
    assert not torch.isnan(rows.float()).any()
    assert torch.equal(rows.view(torch.int16), persistent.view(torch.int16))


@pytest.mark.parametrize("op", sorted({op for op, _ in SKETCH_ROW_GRID}))
def test_sketched_program_per_row_matches_the_persistent_launch(op):
    """A program per row, the finisher claimed early (its ticket after the first load, then waiting for
    the others' done count), against the persistent grid with the ticket taken last: same y bits, the
    same sketch (= ingest's), rows with NaN / inf / a constant value included, and the workspace left
    at its identities by both."""
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(7, 16384, generator=g) * 3).to(torch.bfloat16)
    x[1, 7], x[4, 100], x[5] = float("nan"), float("inf"), 2.5
    ys, sketches = [], []
    for per_sm, early in ((None, True), (1, False), (None, False)):
        y, buf = torch.full_like(x, float("nan")), new_buffer(op, x.device)
        _launch(op, x, y, per_sm, buf, claim_early=early)
        ys.append(y.view(torch.int16))
        sketches.append(read_sketch(op, buf))
        f, i = workspace(op, x.device)
        idents = torch.tensor([v for _, v in WORKSPACE[op][0]] + [0.0] * (SLOTS - len(WORKSPACE[op][0])),
                              dtype=torch.float64)
        assert torch.equal(f[: SLOTS * SPREAD], idents.repeat_interleave(SPREAD)), (per_sm, early)
        assert not i.any(), (per_sm, early)
    assert torch.equal(ys[0], ys[1]) and torch.equal(ys[0], ys[2])
    want = ingest_sketch(op, {"x": x, **_params(op, x.shape[1], x.dtype)})
    for got in sketches:
        close(got, want)
    assert sketches[0]["nonfinite"] == 2
