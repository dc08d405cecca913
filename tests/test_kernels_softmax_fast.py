"""Softmax layout 8 (a select-free branch for rows without -inf, issue #6) under TRITON_INTERPRET=1:
both branches, padding (odd widths) and EVEN widths, NaN/+inf/huge rows, fully and partly masked
rows, against optwin.ingest.sketch and layout 4, with y bit-identical to the kernel without the sketch;
and layout 4 (the default) on HF-style finite causal masks (finfo.min).

    python -m pytest -q tests/test_kernels_softmax_fast.py
"""

from __future__ import annotations

import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest
import torch
from _kernel_checks import close, seed, softmax_layout

from optwin.ingest import sketch as ingest_sketch

DT = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _run(x: torch.Tensor, variant: int = 8) -> tuple[dict[str, float], bool]:
    """(sketch by `variant`, y bit-identical to the kernel without the sketch); layout 8 by default."""
    return softmax_layout(x, variant)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(38, 256), (37, 300), (21, 1024), (9, 1025), (40, 16), (35, 3)])
def test_unmasked_rows_take_the_fast_branch_and_match_ingest(dtype, shape):
    """No -inf anywhere (EVEN widths have no padding; odd widths pad with -inf, out of the min)."""
    g = seed("fast", shape, dtype)
    x = (torch.randn(*shape, generator=g) * torch.logspace(-1, 2, shape[0])[:, None]).to(DT[dtype])
    got, same = _run(x)
    assert same and got["masked_frac"] == 0 and got["masked_rows"] == 0
    want = ingest_sketch("softmax", {"x": x})
    assert 0 < want["peaked_frac"] < 1 or shape[1] < 16
    close(got, want)
    close(got, _run(x, 4)[0], rtol=1e-6)


@pytest.mark.parametrize("shape", [(41, 256), (33, 300), (13, 1025)])
def test_mixed_rows_fully_and_partly_masked(shape):
    """Masked and unmasked rows interleaved in each program: the -inf count (padding subtracted only
    for masked-branch rows), masked rows, the min over non-(-inf) entries."""
    g = seed("mixed", shape)
    n = shape[1]
    x = torch.randn(*shape, generator=g) * torch.logspace(0, 2, shape[0])[:, None]
    x[::3, : n // 4] = -math.inf  # partly masked
    x[4] = -math.inf  # fully masked
    x[7, :-1] = -math.inf  # one finite entry
    x[10] = x[10].abs() + 2.0  # unmasked, positive: the row min is positive
    x[11, ::2] = -math.inf
    x = x.to(torch.bfloat16)
    got, same = _run(x)
    assert same
    want = ingest_sketch("softmax", {"x": x})
    assert got["masked_rows"] == want["masked_rows"] == 1 and 0 < got["masked_frac"] < 1
    close(got, want)


def test_poisoned_rows_in_the_fast_branch_redo_the_program():
    """NaN, +inf and huge finite values in rows without -inf (the fast branch's lane sums go
    non-finite) next to masked rows; one row's h - m overflows to -inf (t NaN in the fast branch),
    which the redo's exact per-row pass must still count as eligible and peaked."""
    g = seed("poison")
    x = torch.randn(40, 256, generator=g) * 3
    x[1, 17] = float("nan")
    x[2, 3] = float("inf")
    x[5, 40] = 1e20  # squares overflow fp32, still finite and eligible
    x[6, 0], x[6, 1] = 3.0e38, -3.0e38  # h - m = -6e38: -inf in fp32; the row is peaked (entropy 0)
    x[8, :30] = -math.inf
    x[9] = -math.inf
    x[9, 4] = float("nan")
    got, same = _run(x)
    assert same
    want = ingest_sketch("softmax", {"x": x})
    assert got["nonfinite"] == want["nonfinite"] == 3
    for k, w in want.items():  # max_row_range 6e38 included: the slow path's range is float64
        assert math.isclose(got[k], w, rel_tol=1e-5, abs_tol=1e-30), f"{k}: kernel {got[k]} != want {w}"
    base, _ = _run(x, 4)
    assert got["peaked_frac"] == want["peaked_frac"] and base["peaked_frac"] == want["peaked_frac"]


def test_the_sweep_input_without_its_mask_matches_ingest():
    """bench/softmax_sketch.py's "no mask" input (rows from flat to peaked, no -inf) at a small width."""
    g = seed("sweep")
    x = (torch.logspace(0, 2, 64).reshape(-1, 1) * torch.randn(64, 512, generator=g)).to(torch.bfloat16)
    got, same = _run(x)
    assert same
    close(got, ingest_sketch("softmax", {"x": x}))
    masked = x.clone()
    masked[:, 1] = -math.inf
    got_m, same_m = _run(masked)
    assert same_m and got_m["masked_frac"] == pytest.approx(1 / 512)
    close(got_m, ingest_sketch("softmax", {"x": masked}))


@pytest.mark.parametrize("variant", [3, 4, 8])  # the layouts after the chunked slow path (0 sums squares in fp32)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_row_range_past_float32_max_is_exact(variant, dtype):
    """3e38 and -3e38 in one row: the range (6e38) is a float64 in the sketch, as in ingest, not inf."""
    x = torch.randn(6, 300, generator=seed("range", variant, dtype)).to(DT[dtype])
    x[2, 0], x[2, 7] = 3e38, -3e38
    got, same = _run(x, variant)
    assert same and math.isfinite(got["max_row_range"])
    close(got, ingest_sketch("softmax", {"x": x}))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_hf_finite_causal_masks_stay_in_the_main_loop_and_match_ingest(dtype):
    """Layout 4 (the default) on attention scores masked as HF's eager attention masks them: the
    causal positions hold finfo.min (finite, its square overflows float32). Such rows sum squares
    scaled by 2^-72 (softmax.HUGE); mixed with plain rows, a fully masked (-inf) row, a NaN row and a
    +inf row (those two still send their program to the exact pass)."""
    g = seed("hf-mask", dtype)
    n = 300
    x = torch.randn(40, n, generator=g) * 4
    causal = torch.arange(n)[None, :] > torch.arange(40)[:, None] * 7  # (rows, n): HF's upper triangle
    x = x.masked_fill(causal, torch.finfo(DT[dtype]).min).to(DT[dtype])  # score + min == min
    x[3] = torch.randn(n, generator=g).to(DT[dtype])  # a plain row between masked ones
    x[5] = -math.inf
    got, same = _run(x, 4)
    assert same
    want = ingest_sketch("softmax", {"x": x})
    assert want["absmax"] == pytest.approx(3.39e38, rel=1e-2)
    for k, w in want.items():
        assert math.isclose(got[k], w, rel_tol=1e-5, abs_tol=1e-30), f"{k}: kernel {got[k]} != want {w}"
    x[11, 2], x[30, 250] = float("nan"), float("inf")
    got, same = _run(x, 4)
    want = ingest_sketch("softmax", {"x": x})
    assert same and got["nonfinite"] == want["nonfinite"] == 2
    for k, w in want.items():
        assert math.isclose(got[k], w, rel_tol=1e-5, abs_tol=1e-30), f"{k}: kernel {got[k]} != want {w}"
