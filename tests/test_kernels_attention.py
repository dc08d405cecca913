"""Triton flash attention (optwin.kernels.attention) under TRITON_INTERPRET=1 on CPU: output against
float64 math and the twin's attention/triton, the fused sketch against optwin.ingest.sketch.

    python -m pytest -q tests/test_kernels_attention.py
"""

from __future__ import annotations

import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest  # noqa: E402
import torch  # noqa: E402

from optwin import twin  # noqa: E402
from optwin.errors import InputError  # noqa: E402
from optwin.ingest.sketch import sketch as ingest_sketch  # noqa: E402
from optwin.kernels import read_sketch, run_variant  # noqa: E402
from optwin.kernels.compare import mismatch_report  # noqa: E402
from optwin.twin.numerics import ulps_between  # noqa: E402

# the interpreter computes 0 * -inf at masked keys before the kernel's tl.where drops it
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# (atol, rtol) against float64 for O(1) outputs: the output rounding plus the rounding of p (half
# types) and a few fp32 ulps of the exp2 / accumulation.
VS_FLOAT64 = {"float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2), "float32": (1e-5, 1e-5)}

# (batch, heads, seq_q, seq_k, d): odd lengths, one key, more keys than queries and fewer, every d
SHAPES = [(1, 2, 37, 37, 16), (2, 1, 5, 70, 32), (1, 1, 1, 1, 16), (1, 2, 130, 67, 64), (1, 1, 67, 130, 128),
          (1, 1, 9, 20, 256)]


def _gen(*key: object) -> torch.Generator:
    return torch.Generator().manual_seed(sum(map(ord, repr(key))) * 7919 % 2**31)


def qkv(shape, dtype: str, g: torch.Generator, q_scale: float = 2.0) -> dict[str, torch.Tensor]:
    b, h, sq, sk, d = shape
    q = q_scale * torch.randn(b, h, sq, d, generator=g)
    k = torch.randn(b, h, sk, d, generator=g)
    v = torch.rand(b, h, sk, d, generator=g) + 0.5  # no cancellation: y is O(1), ulps mean rounding
    return {n: t.to(DT[dtype]) for n, t in (("q", q), ("k", k), ("v", v))}


def run(inp, causal, **kw):
    from optwin.kernels.attention import attention

    return attention(inp["q"], inp["k"], inp["v"], causal=causal, **kw)


def ref64(inp, causal) -> torch.Tensor:
    q, k, v = (inp[n].double() for n in "qkv")
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def sketch_close(got: dict[str, float], want: dict[str, float], rtol: float = 1e-5) -> None:
    assert list(got) == list(want)
    for n in want:
        assert math.isclose(got[n], want[n], rel_tol=rtol, abs_tol=1e-30), f"{n}: kernel {got[n]} != ingest {want[n]}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", list(DT))
def test_output_and_sketch(dtype, shape, causal):
    inp = qkv(shape, dtype, _gen(dtype, shape, causal))
    y, buf = run(inp, causal)
    assert y.dtype == DT[dtype] and y.shape == inp["q"].shape
    report = mismatch_report(y, ref64(inp, causal), *VS_FLOAT64[dtype])
    assert report is None, report
    # the twin of attention/triton models the kernel block by block
    emu = twin.run("attention", "triton", dtype, inp, {"causal": causal}).emulated
    if dtype == "float32":  # the interpreter's fp32 dot is numpy's, not the twin's chunked order
        assert float((y.double() - emu).abs().max()) < 4e-6
    else:  # same fp32 steps, same p and y roundings: equal but for rare 1-ulp flips
        ulps = ulps_between(y.double(), emu, dtype)
        assert float(ulps.max()) <= 1 and float((ulps > 0).double().mean()) < 0.02
    sketch_close(read_sketch("attention", buf, inp["q"].shape), ingest_sketch("attention", inp, {"causal": causal}))


@pytest.mark.parametrize("dtype", list(DT))
def test_sketch_flag_does_not_change_output(dtype):
    inp = qkv((2, 2, 45, 77, 32), dtype, _gen("flag", dtype))
    for causal in (False, True):
        y1, buf = run(inp, causal, sketch=True)
        y0, none = run(inp, causal, sketch=False)
        assert none is None and buf is not None
        assert torch.equal(y0.view(torch.int16 if dtype != "float32" else torch.int32),
                           y1.view(torch.int16 if dtype != "float32" else torch.int32))  # bit-identical


def test_poisoned_output_is_fully_written_and_block_m_is_not_numerics():
    from optwin.kernels.attention import default_config

    inp = qkv((2, 3, 77, 77, 64), "bfloat16", _gen("poison"))
    bm, bn, w, st = default_config(torch.bfloat16, 64)
    want, _ = run(inp, True, sketch=False)
    for config in (None, (32, bn, 4, 2), (64, bn, 4, 2)):  # BLOCK_M < BLOCK_N: the causal split rounds down
        out = torch.full_like(inp["q"], float("nan"))
        y, buf = run(inp, True, out=out, config=config)
        assert y.data_ptr() == out.data_ptr() and not torch.isnan(out).any()
        assert torch.equal(out, want)  # BLOCK_M tiles rows only: same per-row arithmetic
        sketch_close(read_sketch("attention", buf, inp["q"].shape), ingest_sketch("attention", inp, {"causal": True}))


def test_program_order_is_speed_only():
    """Head-major programs (a head's query blocks side by side) and stop 23's order (a query block of
    every head side by side) give the same y and sketch: each program computes the same rows."""
    inp = qkv((2, 3, 77, 130, 32), "bfloat16", _gen("order"))
    for causal in (False, True):
        y1, b1 = run(inp, causal)
        y0, b0 = run(inp, causal, _head_major=False)
        assert torch.equal(y0.view(torch.int16), y1.view(torch.int16))
        # float64 sums merged in another program order: equal to their last bits
        sketch_close(read_sketch("attention", b0, inp["q"].shape), read_sketch("attention", b1, inp["q"].shape), 1e-12)


def test_run_variant_and_strided_inputs():
    g = _gen("strided")
    base = {n: torch.randn(2, 21, 3, 32, generator=g).half() for n in "qkv"}  # (B, S, H, D) as HF holds it
    inp = {n: t.transpose(1, 2) for n, t in base.items()}  # (B, H, S, D) views, strided
    y = run_variant("attention", "triton", "float16", inp, {"causal": True})
    yc, _ = run({n: t.contiguous() for n, t in inp.items()}, True)
    assert torch.equal(y, yc)
    report = mismatch_report(y, ref64(inp, True), *VS_FLOAT64["float16"])
    assert report is None, report
    sdpa = run_variant("attention", "sdpa", "float16", inp, {"causal": True}).double()
    assert float((y.double() - sdpa).abs().max()) < 4e-3


def test_nonfinite_inputs_counted_and_skipped():
    g = _gen("nan")
    inp = qkv((1, 2, 10, 13, 16), "float32", g)
    inp["q"][0, 0, 3, 5] = float("nan")  # row 3 of head 0: NaN scores, dropped from peaked_frac
    inp["k"][0, 1, 12, 0] = float("inf")  # key 12 of head 1: every non-causal row of head 1 is non-finite
    inp["v"][0, 0, 4, 2] = -float("inf")
    inp["q"][0, 1, 0, 0] = 1e4  # the largest finite magnitude
    for causal in (False, True):
        y, buf = run(inp, causal)
        got = read_sketch("attention", buf, inp["q"].shape)
        want = ingest_sketch("attention", inp, {"causal": causal})
        sketch_close(got, want)
        assert got["nonfinite"] == 3 and got["absmax"] == 1e4
        assert torch.isnan(y[0, 0, 3]).all()


def test_peaked_frac_counts_low_entropy_rows():
    g = _gen("peaked")
    b, h, s, d = 1, 2, 24, 32
    q = 0.05 * torch.randn(b, h, s, d, generator=g)
    k = torch.randn(b, h, s, d, generator=g)
    q[:, :, ::2] = 0.0
    q[:, :, ::2, 0] = 200.0  # even rows: key 5 wins by a score gap > 24, entropy ~ 0
    k[:, :, :, 0] = k[:, :, :, 0].clamp(-0.3, 0.3)
    k[:, :, 5, 0] = 1.0  # odd rows (|q| ~ 0.3) stay near uniform, entropy ~ ln 24
    v = torch.rand(b, h, s, d, generator=g)
    inp = {"q": q.half(), "k": k.half(), "v": v.half()}
    _, buf = run(inp, False)
    got = read_sketch("attention", buf, q.shape)
    want = ingest_sketch("attention", inp, {"causal": False})
    assert got["peaked_frac"] == want["peaked_frac"] == 0.5
    sketch_close(got, want)
    # the threshold is a parameter of the kernel: above ln(24) every row is peaked
    from optwin.kernels.attention import attention

    _, buf = attention(inp["q"], inp["k"], inp["v"], low_entropy_nats=math.log(24) + 0.01)
    assert read_sketch("attention", buf, q.shape)["peaked_frac"] == 1.0


def test_peaked_frac_over_sampled_query_blocks():
    """From 2 * ENTROPY_ROWS query rows on the sketch sums the entropies of every ent_stride-th query block, by
    (block + head) so each head samples other positions: peaked_frac is then exact over those blocks'
    rows, and every row still counts for max_score."""
    from optwin.catalog import DEFAULT_TOLERANCES
    from optwin.ingest.sketch import logit_row_entropy
    from optwin.kernels.attention import default_config

    g = _gen("sampled")
    b, h, sq, sk, d = 1, 3, 300, 40, 16
    q = torch.randn(b, h, sq, d, generator=g) * torch.linspace(0.1, 12.0, sq)[:, None]  # flat to peaked rows
    inp = {"q": q.half(), "k": torch.randn(b, h, sk, d, generator=g).half(), "v": torch.rand(b, h, sk, d, generator=g).half()}
    bm = default_config(torch.float16, d)[0]
    for causal in (False, True):
        full = read_sketch("attention", run(inp, causal, _entropy_stride=1)[1], q.shape)
        got = read_sketch("attention", run(inp, causal, _entropy_stride=2)[1], q.shape)
        scores = inp["q"].double() @ inp["k"].double().transpose(-1, -2) / math.sqrt(d)  # (b, h, sq, sk)
        if causal:
            scores = scores.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(1), -math.inf)
        ent, elig = logit_row_entropy(scores.reshape(-1, sk))
        blocks = torch.arange(sq) // bm
        sampled = ((blocks[None, :] + torch.arange(h)[:, None]) % 2 == 0).reshape(-1)  # (h * sq,), b = 1
        assert 0 < int(sampled.sum()) < h * sq
        peaked = elig & (ent < DEFAULT_TOLERANCES.low_entropy_nats)
        want = float(peaked[sampled].sum()) / float(elig[sampled].sum())
        assert got["peaked_frac"] == pytest.approx(want, abs=1.5 / float(elig[sampled].sum()))
        assert 0.05 < want < 0.95 and got["peaked_frac"] != full["peaked_frac"]  # the sample is not every row
        assert {n: v for n, v in got.items() if n != "peaked_frac"} == {n: v for n, v in full.items() if n != "peaked_frac"}


def test_entropy_stride_keeps_enough_rows():
    from optwin.kernels.attention import ENTROPY_ROWS, entropy_stride

    assert entropy_stride(2 * 8 * 1000, 8) == 1  # small launches: every row
    assert entropy_stride(4 * 32 * 4096, 32) == 8 and 4 * 32 * 4096 // 8 >= ENTROPY_ROWS
    assert entropy_stride(1 << 30, 4) == 4  # at most a head's query blocks: every head keeps one


@pytest.mark.parametrize("config", [(128, 32, 8, 2), (32, 64, 4, 2)])
def test_key_value_share_covers_every_key_once_at_other_block_ratios(config):
    """Each program's share is the key tiles starting in its own query range (then round robin past every
    range): with 4 key tiles a query block (two loaded ahead, two in the loop) and with half a tile, the
    sketch still counts every key and value once, with and without a non-finite entry."""
    inp = qkv((1, 2, 150, 290, 64), "bfloat16", _gen("share", config))
    for poison in (False, True):
        if poison:
            inp["v"][0, 1, 289, 3] = float("inf")  # the last key: round robin past every query range
        _, buf = run(inp, True, config=config)
        got = read_sketch("attention", buf, inp["q"].shape)
        sketch_close(got, ingest_sketch("attention", inp, {"causal": True}))
        assert got["nonfinite"] == float(poison)


def test_finisher_reduces_records_over_several_polls():
    """The grid's last program reads the programs' records a poll at a time: a non-finite entry in the last
    poll's programs, and records left at the sentinel for the next launch (the same call twice agrees)."""
    g = _gen("polls")
    inp = qkv((2, 19, 3, 5, 16), "float16", g)  # 38 programs: polls of 16 records, 6 in the last
    inp["v"][1, 18, 4, 7] = float("nan")  # the last program's value tile
    inp["q"][1, 2, 0, 0] = 300.0  # the largest finite |q|, in the third poll too
    want = ingest_sketch("attention", inp, {"causal": False})
    got = [read_sketch("attention", run(inp, False, _poll=16)[1], inp["q"].shape) for _ in range(2)]
    assert got[0] == got[1] and got[0]["nonfinite"] == 1 and got[0]["absmax"] == 300.0
    sketch_close(got[0], want)


def test_workspace_is_reset_between_launches():
    inp = qkv((1, 3, 33, 33, 16), "float16", _gen("reset"))
    s1 = read_sketch("attention", run(inp, True)[1], inp["q"].shape)
    small = {n: t[:, :1, :5] for n, t in inp.items()}
    s2 = read_sketch("attention", run(small, True)[1], small["q"].shape)
    s3 = read_sketch("attention", run(inp, True)[1], inp["q"].shape)
    assert s1 == s3 and s2["rows"] == 5 and s2["absmax"] <= s1["absmax"]
    sketch_close(s2, ingest_sketch("attention", small, {"causal": True}))


@pytest.mark.parametrize(("shapes", "dtypes", "msg"), [
    (((1, 1, 4, 24), (1, 1, 4, 24), (1, 1, 4, 24)), (torch.float16,) * 3, "head dim 24"),
    (((1, 1, 4, 16), (1, 2, 4, 16), (1, 2, 4, 16)), (torch.float16,) * 3, "disagree"),
    (((1, 1, 4, 16), (1, 1, 4, 16), (1, 1, 4, 16)), (torch.float16, torch.float32, torch.float16), "share one"),
    (((4, 16), (4, 16), (4, 16)), (torch.float16,) * 3, "(batch, heads, seq, d)"),
])
def test_bad_inputs_raise_one_line_errors(shapes, dtypes, msg):
    q, k, v = (torch.zeros(s, dtype=t) for s, t in zip(shapes, dtypes))
    with pytest.raises(InputError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        run({"q": q, "k": k, "v": v}, False)
