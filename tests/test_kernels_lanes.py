"""Per-lane sketch accumulators (issue #6) under TRITON_INTERPRET=1: softmax layouts 4 and 8, the
rope / layernorm / rmsnorm lane accumulators, against optwin.ingest.sketch and the older layouts
(softmax layout 3), with y bit-identical to the kernel without the sketch.

    python -m pytest -q tests/test_kernels_lanes.py
"""

from __future__ import annotations

import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest
import torch
from _kernel_checks import close, norm_inputs, run_norm, seed, softmax_layout

from optwin.ingest import sketch as ingest_sketch
from optwin.kernels import read_sketch
from optwin.kernels.sketch_buffer import new_buffer

DT = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def _fast_rows(n_rows: int, n: int, dtype: str, g: torch.Generator) -> torch.Tensor:
    """Finite rows with masks and no NaN/+inf: the lane accumulators' fast path end to end."""
    x = torch.randn(n_rows, n, generator=g) * torch.logspace(-1, 2, n_rows)[:, None]
    x[::7, : n // 3] = -math.inf  # partly masked rows
    x[3] = -math.inf  # fully masked rows (two programs' worth)
    x[n_rows - 2] = -math.inf
    x[5] = x[5].abs() + 1.0  # all finite entries positive, with masks: the min is positive
    x[5, ::2] = -math.inf
    x[6, -1] = 3e17  # above the older layouts' BIG (2**55), squares still finite in fp32
    x[8, :] = -math.inf
    x[8, n // 2] = -2.5  # one finite entry: range 0, entropy 0
    return x.to(DT[dtype])


@pytest.mark.parametrize("variant", [4, 8])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(41, 300), (37, 1024), (9, 1025), (40, 16), (35, 3)])
def test_softmax_lane_variants_fast_path_match_ingest(variant, dtype, shape):
    """Many rows per program (FLUSH = 16 rows flushes the lane sums), block-boundary and odd widths."""
    x = _fast_rows(*shape, dtype, seed("lanes-fast", shape, dtype))
    got, same = softmax_layout(x, variant)
    assert same
    want = ingest_sketch("softmax", {"x": x})
    assert got["masked_rows"] == want["masked_rows"] >= 2 and got["nonfinite"] == 0
    close(got, want)


@pytest.mark.parametrize("variant", [4, 8])
def test_softmax_lane_variants_slow_rows_redo_the_program(variant):
    """NaN, +inf, rows of -inf with a NaN, squares overflowing fp32 (no NaN at all in one case):
    the program re-reads its rows for exact statistics; peaked/eligible stay per row."""
    g = seed("lanes-slow", variant)
    x = torch.randn(40, 200, generator=g) * torch.logspace(0, 2, 40)[:, None]
    x[1, 17] = float("nan")
    x[2, 3] = float("inf")
    x[4] = -math.inf
    x[4, 9] = float("nan")  # masked but for a NaN: not a masked row, not eligible
    x[10, 40] = 1e20  # squares overflow fp32, still finite and eligible
    x[11, :] = -math.inf
    got, same = softmax_layout(x.to(torch.float32), variant)
    assert same
    want = ingest_sketch("softmax", {"x": x})
    assert got["nonfinite"] == 3 and got["masked_rows"] == 1
    close(got, want)
    # only overflow (no NaN/+inf): the redo is triggered by the lane sums alone
    y = torch.randn(33, 64, generator=g)
    y[20, 5] = -4e19
    y[21, :10] = -math.inf
    got, same = softmax_layout(y, variant)
    assert same and got["rms"] > 1e17
    close(got, ingest_sketch("softmax", {"x": y}))


def test_softmax_lane_variants_agree_with_variant_3():
    x = _fast_rows(50, 130, "bfloat16", seed("lanes-v3"))
    x[12, 4] = float("nan")
    base, _ = softmax_layout(x, 3)
    for v in (4, 8):
        got, same = softmax_layout(x, v)
        assert same
        close(got, base, rtol=1e-6)


def test_softmax_lane_variant_on_empty_and_tiny_inputs():
    got, same = softmax_layout(torch.empty(0, 7), 4)
    assert same and got["numel"] == 0 and got["rms"] == 0 and got["masked_rows"] == 0
    x = torch.tensor([[1.5]])
    got, same = softmax_layout(x, 4)
    assert same
    close(got, ingest_sketch("softmax", {"x": x}))


# ------------------------------------------------------------------ rope, layernorm, rmsnorm


def _rope(x: torch.Tensor, pos: torch.Tensor, lane_acc: bool, **kw) -> tuple[torch.Tensor, dict[str, float]]:
    from optwin.kernels.rope import _inv_freq, _rope_launch

    y, buf = torch.empty_like(x), new_buffer("rope", x.device)
    _rope_launch(x.unsqueeze(0), y.unsqueeze(0), buf, positions=pos.unsqueeze(0), inv=_inv_freq(x.shape[-1], 1e4, x.device),
                 base=1e4, lane_acc=lane_acc, **kw)
    return y, read_sketch("rope", buf, x.shape, {"base": 1e4})


@pytest.mark.parametrize("poison", ["none", "nan", "inf", "overflow"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_rope_lane_accumulators_match_per_element_and_ingest(poison, dtype):
    g = seed("rope-lanes", poison, dtype)
    x = torch.randn(70, 6, 32, generator=g)  # 70 positions over 2 programs: the float64 flush runs
    if poison == "nan":
        x[33, 2, 5] = float("nan")
    elif poison == "inf":
        x[2, 0, 31] = -float("inf")
    elif poison == "overflow":
        x[50, 1, 1] = 3e30  # float32 only: the lane sum overflows, the exact path recomputes
    x = x.to(DT[dtype])
    pos = torch.randint(0, 500, (70,), generator=g)
    y1, s1 = _rope(x, pos, True)
    y0, s0 = _rope(x, pos, False)
    yn, _ = _rope(x, pos, True, block_h=4)  # partial head blocks
    ya, sa = _rope(x, pos, True, block_h=4, ahead=True)  # each tile's x loaded during the previous tile's work
    torch.testing.assert_close(y1, y0, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(yn, y0, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(ya, y0, rtol=0, atol=0, equal_nan=True)
    close(s1, s0, rtol=1e-5)
    close(sa, s0, rtol=1e-5)
    close(s1, ingest_sketch("rope", {"x": x, "positions": pos}, {"base": 1e4}))


def test_rope_ahead_on_an_empty_x_sketches_it_as_the_shipped_launch():
    """No positions, no tiles: the sketched launch still runs (for its buffer), with no first tile to load ahead."""
    x, pos = torch.randn(0, 4, 16).to(torch.bfloat16), torch.arange(0)
    y1, s1 = _rope(x, pos, True, ahead=True)
    y0, s0 = _rope(x, pos, True)
    assert y1.shape == (0, 4, 16) and s1 == s0 and s1["numel"] == 0


def _norm(op: str, x: torch.Tensor, **kw) -> tuple[torch.Tensor, dict[str, float]]:
    """(y, sketch) of the Triton norm; kw are launch overrides."""
    return run_norm(op, norm_inputs(op, x), **kw)


@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("poison", ["none", "nan", "inf_max"])
@pytest.mark.parametrize("shape", [(9, 45), (6, 1024), (5, 1025), (70, 16)])
def test_norm_bad_rows_and_lane_max_match_ingest(op, poison, shape):
    """A program with NaN/±inf rows recomputes its max |x| after the loop, including the finite rows
    (an +inf must not become the absmax, a finite max must not be lost): layernorm's lane max saw
    those rows too; rmsnorm has a per-row tree. y is the same with and without the sketch."""
    g = seed("norm-lanes", op, poison, shape)
    x = 0.5 + 2 * torch.randn(*shape, generator=g)
    x[2, 7] = 40.0  # the largest finite |x|, in a finite row of the program that also gets the bad row
    if poison == "nan":
        x[4, 3] = float("nan")
    elif poison == "inf_max":
        x[0, 1] = float("inf")
        x[1, 2] = -float("inf")
    y1, s1 = _norm(op, x)
    want = ingest_sketch(op, norm_inputs(op, x))
    assert s1["absmax"] == 40.0
    close(s1, want)


def test_layernorm_row_slots_cover_constant_rows_min_std_and_bad_rows():
    """Rows spread over full and partial slot sets: constant rows (std 0: their |c| goes to
    const_absmax, not to the ratio), a near-constant row (one element off: it cancels, so it counts
    in the ratio), the smallest std in a late row, a NaN row among them."""
    g = seed("ln-slots")
    x = torch.randn(90, 8, generator=g).to(torch.bfloat16)  # BLOCK 8, VEC 8: one lane, flushed every row
    x[37] = 2.5  # constant: std 0
    x[12] = -96.0  # the largest constant |c|, in another program
    x[60] = 300.0
    x[60, 3] = 302.0  # near-constant: |mean|/std ~ 400
    x[81] = x[81] * 1e-3  # the smallest std
    x[55, 2] = float("nan")
    x = x.float()
    _, s1 = _norm("layernorm", x)
    want = ingest_sketch("layernorm", norm_inputs("layernorm", x))
    assert s1["const_absmax"] == 96.0 and s1["nonfinite"] == 1 and s1["min_row_std"] == 0.0
    assert 300 < s1["max_mean_over_std"] < 500
    close(s1, want)


def test_rope_sketch_takes_the_h100s_small_tiles_and_the_h200_keeps_its_launch():
    # H100 (stop 47): the sketched launch at 32 heads a tile and 4 warps, per-element accumulators, ran 94.4 µs in
    # CUDA graphs against 100.6-101.1 for the H200's launch at 4096x128x128 bf16; the H200 was not timed so
    from optwin.kernels.rope import ROPE_MAXNREG, rope_config

    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    assert rope_config(128, 128, True, device=h100) == (32, 64, 4, 1)
    assert rope_config(32, 128, True, device=h100) == (32, 64, 4, 1)
    assert rope_config(128, 128, False, device=h100) == (128, 64, 8, 1)  # without the sketch: the same launch
    assert rope_config(128, 128, True, device=h200) == rope_config(128, 128, True) == (128, 64, 8, 1)
    assert (32, 64, 4) not in ROPE_MAXNREG  # the timed launch's accumulators were per element
    assert rope_config(128, 128, True, block_h=64, device=h100)[0] == 64  # the bench's overrides still win
