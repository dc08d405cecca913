"""softmax's sketched launch with a program per row (row records and the finisher, optwin.kernels.softmax_rows)
under TRITON_INTERPRET=1, forced at widths where the persistent launch runs by default: y bit-identical to the
launches with and without the sketch, the sketch as ingest's and as the persistent launch's, flagged rows
(NaN / inf) across the finisher's polls, every record word and workspace slot back at rest.

    python -m pytest -q tests/test_kernels_softmax_rows.py
"""

from __future__ import annotations

import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest
import torch
from _kernel_checks import bits, close, seed

from optwin.ingest import sketch as ingest_sketch
from optwin.kernels import read_sketch
from optwin.kernels._common import RECORD_POLL
from optwin.kernels.sketch_buffer import (
    new_buffer,
    row_records,
    workspace,
    workspace_identities,
)
from optwin.kernels.softmax import ROWS_BLOCKS, _softmax_launch


def _launch(x: torch.Tensor, rows: bool | None) -> tuple[torch.Tensor, dict[str, float]]:
    """(y, sketch) of the layout-10 launch, a program per row (rows=True) or persistent (False)."""
    y = torch.empty_like(x)
    buf = new_buffer("softmax", x.device)
    _softmax_launch(x, y, buf, variant=10, rows=rows)
    return y, read_sketch("softmax", buf, x.shape)


def _check(x: torch.Tensor) -> dict[str, float]:
    """The row launch against the launch without the sketch (y's bits), ingest and the persistent launch
    (the sketch), and the records and workspace left at rest; returns the row launch's sketch."""
    y_rows, got = _launch(x, True)
    y_pers, pers = _launch(x, False)
    y_plain = torch.empty_like(x)
    _softmax_launch(x, y_plain, None)
    assert torch.equal(bits(y_rows), bits(y_plain)) and torch.equal(bits(y_pers), bits(y_plain))
    close(got, ingest_sketch("softmax", {"x": x}))
    close(got, pers)
    words = row_records("softmax", x.device, x.shape[0], words=2, extra=0)[0]
    assert (words == -1).all(), "a record word was left off the sentinel"
    f, i = workspace("softmax", x.device)
    assert f[: len(workspace_identities("softmax"))].tolist() == workspace_identities("softmax") and (i == 0).all()
    return got


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(41, 300), (9, 2), (6, 1000)])
def test_row_launch_matches_ingest_and_the_persistent_launch(dtype, shape):
    """Masked rows of several scales, fully masked rows, a row with one finite entry (entropy 0)."""
    g = seed("softmax-rows", shape, dtype)
    n_rows, n = shape
    x = torch.randn(n_rows, n, generator=g) * torch.logspace(-1, 2, n_rows)[:, None]
    x[::5, : n // 3] = -math.inf
    x[2] = -math.inf
    x[4, :] = -math.inf
    x[4, n // 2] = -2.5
    got = _check(x.to(dtype))
    assert got["masked_rows"] >= 1 and got["nonfinite"] == 0


def test_row_launch_hf_masks_huge_values_and_nonfinite_rows():
    """HF masks (finfo.min: the HUGE rows, whose squares the records hold scaled by 2^-144, the mask's counted)
    beside large values, a range past float32, and rows with NaN / +inf / -inf beside values (flagged: their partials go through the workspace)
    in the first and later polls of the finisher."""
    g = seed("softmax-rows-special")
    lo = torch.finfo(torch.bfloat16).min
    n_rows = RECORD_POLL * 2 + 37  # three polls
    x = torch.randn(n_rows, 64, generator=g)
    x[1, 30:] = lo
    x[3] = lo
    x[5, 0], x[5, 3] = 3e38, -3e38
    x[7, 2], x[7, 5:20] = 1e30, -math.inf
    x[9, 3], x[9, 20:] = 2.0**55, lo  # HF's mask counted, beside a plain square near HUGE's (not to be unscaled)
    x[13, 3], x[13, 20:] = -3e38, lo  # beside a value whose plain square overflows: the exact pass
    for r, v in ((11, math.nan), (RECORD_POLL + 3, math.inf), (n_rows - 1, math.nan), (n_rows - 2, -math.inf)):
        x[r, 9] = v
    x[RECORD_POLL - 1, :] = math.nan  # a flagged row at a poll's last slot
    got = _check(x.to(torch.bfloat16))
    assert got["nonfinite"] == 64 + 3 and got["masked_rows"] == 0


def test_rows_take_the_row_launch_by_width():
    """The launch a program per row is ROWS_BLOCKS' (16384-wide rows); a launch of no rows still writes
    its features."""
    assert ROWS_BLOCKS == {8192, 16384}
    x = torch.zeros(0, 16384, dtype=torch.bfloat16)
    _, got = _launch(x, None)
    assert got["rows"] == 0 and got["numel"] == 0


def test_default_launch_at_8192_wide_is_the_row_launch():
    """Rows of 8000 (BLOCK 8192, in ROWS_BLOCKS) take the row launch by default: it leaves its record words at
    the sentinel, and its y and sketch are the persistent launch's, with a NaN row flagged."""
    g = seed("softmax-rows-8192")
    x = torch.randn(5, 8000, generator=g) * 4.0
    x[1, :100] = -math.inf
    x[3, 7] = math.nan
    xb = x.to(torch.bfloat16)
    words = row_records("softmax", xb.device, 5, words=2, extra=0)[0]
    words[:10] = 12345  # not the sentinel: only a launch with records puts it back
    y_row, got = _launch(xb, None)
    assert (words[:10] == -1).all()
    y_pers, pers = _launch(xb, False)
    assert torch.equal(bits(y_row), bits(y_pers))
    close(got, pers)
    close(got, ingest_sketch("softmax", {"x": xb}))
