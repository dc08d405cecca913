"""One program per row for the launches that _common.ROW_GRID lists: the grid never changes y (each
row is one program's tree either way), the bench's per_sm still overrides, and rmsnorm's sketched
launch with row records (a record word per row, polled by a finisher program) gives the persistent
launch's y and ingest's sketch, and leaves its records at the sentinel. Interpreter (TRITON_INTERPRET=1).

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
        _layernorm_launch(x, w, b, y, None, EPS, per_sm=per_sm, welford=False)  # the row-in-registers kernel
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


def _rms_sketch(x: torch.Tensor, w: torch.Tensor, **kw) -> tuple[torch.Tensor, dict[str, float]]:
    from optwin.kernels.rmsnorm import EPS, _rmsnorm_launch
    from optwin.kernels.sketch_buffer import new_buffer, read_sketch

    y, buf = torch.full_like(x, float("nan")), new_buffer("rmsnorm", x.device).fill_(float("nan"))
    _rmsnorm_launch(x, w, y, buf, EPS, **kw)
    return y, read_sketch("rmsnorm", buf)


@pytest.mark.parametrize(("rows", "n", "dtype"), [(1100, 40, torch.float32), (5, 16384, torch.bfloat16),
                                                   (600, 33, torch.float16)])
def test_rmsnorm_row_records_give_the_persistent_y_and_ingests_sketch(rows, n, dtype):
    """Rows with NaN, ±inf and a finite value whose fp32 square overflows take the flagged path
    (exact partials in the extra record, the flag released after them); they sit on both sides of a
    poll boundary (_common.RECORD_POLL rows per poll)."""
    from optwin.ingest.sketch import sketch as ingest_sketch
    from optwin.kernels._common import RECORD_POLL
    from optwin.kernels.sketch_buffer import SENTINEL, row_records

    g = torch.Generator().manual_seed(rows)
    x, w = (torch.randn(rows, n, generator=g) * 3).to(dtype), (1 + 0.2 * torch.randn(n, generator=g)).to(dtype)
    for r in {1, rows - 1, RECORD_POLL - 1, RECORD_POLL} & set(range(rows)):
        x[r, r % n] = (float("nan"), float("inf"), -float("inf"), 3e20 if dtype != torch.float16 else 6e4)[r % 4]
    y, got = _rms_sketch(x, w, row_grid=True)
    y_persistent, persistent = _rms_sketch(x, w, row_grid=False)
    y0 = torch.full_like(x, float("nan"))
    from optwin.kernels.rmsnorm import EPS, _rmsnorm_launch

    _rmsnorm_launch(x, w, y0, None, EPS)  # without the sketch
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(y.view(bits), y_persistent.view(bits)) and torch.equal(y.view(bits), y0.view(bits))
    want = ingest_sketch("rmsnorm", {"x": x, "weight": w})
    assert got["nonfinite"] == want["nonfinite"] > 0
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-6, abs=1e-30), k
        assert got[k] == pytest.approx(persistent[k], rel=1e-6, abs=1e-30), k
    words, _ = row_records("rmsnorm", x.device, rows)
    assert bool((words == SENTINEL).all())  # every word the launch used is back at the sentinel


def test_row_records_grow_with_the_rows_and_serve_the_next_launch():
    from optwin.kernels.sketch_buffer import SENTINEL, row_records

    g = torch.Generator().manual_seed(2)
    dev = torch.device("cpu")
    for rows in (3, 1500, 7):  # 1500 rows grow the records to 2048 words; 7 reuses them
        x, w = torch.randn(rows, 24, generator=g), torch.randn(24, generator=g)
        _, got = _rms_sketch(x, w, row_grid=True)
        assert got["rows"] == rows and got["absmax"] == pytest.approx(float(x.abs().max()), rel=1e-7)
        assert got["max_row_rms"] == pytest.approx(float(x.pow(2).mean(1).sqrt().max()), rel=1e-6)
    words, extra = row_records("rmsnorm", dev, 1)
    cap = words.shape[0]  # grown to a power of two (another test may have grown them further)
    assert cap >= 1500 and cap & (cap - 1) == 0 and extra.shape == (cap, 2) and bool((words == SENTINEL).all())


def test_row_records_at_other_poll_sizes_give_the_same_sketch():
    """The bench's poll override (record words per finisher poll): flagged rows on both sides of a
    128-row poll boundary, the same features at every size."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(300, 24, generator=g), torch.randn(24, generator=g)
    x[127, 3], x[128, 0], x[299, 5] = float("nan"), 3e20, float("inf")
    sketches = [_rms_sketch(x, w, row_grid=True, poll=p)[1] for p in (128, 256, 512)]
    assert sketches[0]["nonfinite"] == 2
    for s in sketches[1:]:
        for k, v in sketches[0].items():
            assert s[k] == pytest.approx(v, rel=1e-12, abs=1e-30), k
