"""rmsnorm / layernorm rows longer than one program's registers (the chunked kernels) under
TRITON_INTERPRET=1: the output against float64 math and the twin, the sketch against
optwin.ingest.sketch, with NaN/±inf and constant rows in the programs.

    python -m pytest -q tests/test_kernels_chunked.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest  # noqa: E402
import torch  # noqa: E402
from _kernel_checks import close, norm_inputs, run_norm, seed

from optwin import twin  # noqa: E402
from optwin.ingest import sketch as ingest_sketch  # noqa: E402


def _ulps(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest |got - want| in ulps of got's dtype at the row's largest |want|: a per-element ulp
    would blow up where w * (h - m) * r cancels against the bias."""
    fi = torch.finfo(got.dtype)
    g, w = got.double(), want.double()
    scale = torch.where(torch.isfinite(w), w.abs(), 0.0).amax(-1, keepdim=True).clamp(min=fi.tiny)  # (rows, 1)
    both = torch.isfinite(g) & torch.isfinite(w)
    return float(torch.where(both, (g - w).abs() / (fi.eps * scale), 0.0).max())


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("poison", ["none", "nan", "inf", "constant"])
def test_chunked_rows_match_whole_rows_and_ingest(op, poison):
    """A 300-wide row read in 64-wide chunks (5 pieces, the last partial) against the same row held
    whole: the same values to float32 rounding (the sum order differs), y the same with and without
    the sketch, and the sketch equal to optwin.ingest's, also for programs holding NaN/±inf rows
    (their exact pass after the loop) and constant rows (std 0)."""
    g = seed("chunked", op, poison)
    x = (0.5 + 2 * torch.randn(9, 300, generator=g)).to(torch.bfloat16)
    x[2, 7] = 40.0  # the largest finite |x|, in a program that also gets the bad row
    if poison == "nan":
        x[4, 3] = float("nan")
    elif poison == "inf":
        x[0, 1] = float("inf")
        x[1, 2] = -float("inf")
    elif poison == "constant":
        x[5] = 2.5
    inp = norm_inputs(op, x)
    y, s = run_norm(op, inp, True, chunk=64)
    y0, _ = run_norm(op, inp, False, chunk=64)
    yw, sw = run_norm(op, inp, True)  # 300 <= MAX_BLOCK: the row in registers
    torch.testing.assert_close(y, y0, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(torch.isfinite(yw), torch.isfinite(y))
    assert _ulps(y, yw) <= 2.0
    want = ingest_sketch(op, inp)
    assert s["absmax"] == 40.0
    close(s, want)
    close(s, sw, rtol=1e-6)


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_past_the_register_limit_take_the_chunked_kernel_and_match_the_twin(op, dtype):
    """Rows of 70000 (> MAX_BLOCK = 65536) used to be refused; now they go to the chunked kernel, whose
    sum order (per-lane sums over TRITON_CHUNK pieces, then a tree) the triton twin models."""
    g = seed("chunked-long", op, str(dtype))
    x = (0.5 + 2 * torch.randn(2, 70000, generator=g)).to(dtype)
    inp = norm_inputs(op, x)
    y, s = run_norm(op, inp, True)
    emu = twin.run(op, "triton", str(dtype).removeprefix("torch."), inp).emulated
    assert _ulps(y, emu) <= 2.0
    close(s, ingest_sketch(op, inp))


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("n,chunk", [(2048, 512), (3000, 1000)])
def test_chunked_compile_time_row_length_changes_nothing(op, n, chunk):
    """const_n compiles the chunked kernel for the row length (no masks, a known trip count: rmsnorm
    75.6 -> 70.9 µs on the H200, norm_chunks_h200_s15h.md): same y bits and sketch; a length that is
    not a multiple of the chunk falls back to the masked loops."""
    from optwin.kernels.layernorm import _layernorm_launch
    from optwin.kernels.rmsnorm import EPS, _rmsnorm_launch
    from optwin.kernels.sketch_buffer import new_buffer, read_sketch

    g = seed("const-n", op, n)
    x, w = torch.randn(7, n, generator=g).to(torch.bfloat16), torch.randn(n, generator=g).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16)
    x[2, 5] = float("nan")
    x[4] = 1.5  # a constant row: layernorm's exact constant test
    out = []
    for const_n in (False, True):
        y, buf = torch.empty_like(x), new_buffer(op, x.device)
        if op == "rmsnorm":
            _rmsnorm_launch(x, w, y, buf, EPS, chunk=chunk, const_n=const_n)
        else:
            _layernorm_launch(x, w, b, y, buf, EPS, chunk=chunk, const_n=const_n)
        out.append((y, read_sketch(op, buf)))
    assert torch.equal(out[0][0].view(torch.int16), out[1][0].view(torch.int16))
    assert out[0][1] == out[1][1]
    assert out[1][1]["nonfinite"] == 1
