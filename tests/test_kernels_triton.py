"""Triton kernels under TRITON_INTERPRET=1 on CPU: outputs against float64 math and against the
production torch variants, and the fused sketch against optwin.ingest.sketch.

    python -m pytest -q tests/test_kernels_triton.py
"""

from __future__ import annotations

import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest  # noqa: E402
import torch  # noqa: E402
from _kernel_checks import close, seed

from optwin.ingest import sketch as ingest_sketch  # noqa: E402
from optwin.kernels import read_sketch, run_variant  # noqa: E402
from optwin.kernels.compare import mismatch_report  # noqa: E402

DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}

# (dtype, atol, rtol) against float64 math: output rounding (u = 2^-11, 2^-8, 2^-24) plus a few
# fp32 ulps of accumulated error (approximate rsqrt/exp), relative to O(1) outputs.
VS_FLOAT64 = [("float16", 2e-3, 2e-3), ("bfloat16", 1.6e-2, 1.6e-2), ("float32", 2e-5, 2e-5)]
# against the production torch variant: both round to dtype, so allow twice the rounding
VS_PRODUCTION = [("float16", 4e-3, 4e-3), ("bfloat16", 3.2e-2, 3.2e-2), ("float32", 4e-5, 4e-5)]

SHAPES = [(3, 781), (1, 1), (5, 1024), (7, 1025), (2, 3, 64)]


# ------------------------------------------------------------------ per-op inputs and float64 math


def rms_inputs(shape, dtype, g):
    dt = DT[dtype]
    return {"x": (2 * torch.randn(*shape, generator=g)).to(dt), "weight": (1 + 0.2 * torch.randn(shape[-1], generator=g)).to(dt)}, {}


def rms_ref(inp, params):
    x, w = inp["x"].double(), inp["weight"].double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def rms_kernel(inp, params, sketch):
    from optwin.kernels.rmsnorm import rmsnorm

    return rmsnorm(inp["x"], inp["weight"], sketch=sketch)


def softmax_inputs(shape, dtype, g):
    x = 3 * torch.randn(*shape, generator=g)
    if shape[-1] > 4:  # a masked column and, for several rows, a fully masked row
        x[..., 1] = -math.inf
        if x.shape[0] > 2:
            x[1] = -math.inf
    return {"x": x.to(DT[dtype])}, {}


def softmax_ref(inp, params):
    return torch.softmax(inp["x"].double(), -1)


def softmax_kernel(inp, params, sketch):
    from optwin.kernels.softmax import softmax

    return softmax(inp["x"], sketch=sketch)


def ln_inputs(shape, dtype, g):
    dt = DT[dtype]
    n = shape[-1]
    x = 0.5 + 2 * torch.randn(*shape, generator=g)
    return {"x": x.to(dt), "weight": (1 + 0.2 * torch.randn(n, generator=g)).to(dt),
            "bias": (0.1 * torch.randn(n, generator=g)).to(dt)}, {}


def ln_ref(inp, params):
    x = inp["x"].double()
    m = x.mean(-1, keepdim=True)
    var = ((x - m) ** 2).mean(-1, keepdim=True)
    return (x - m) / torch.sqrt(var + 1e-5) * inp["weight"].double() + inp["bias"].double()


def ln_kernel(inp, params, sketch):
    from optwin.kernels.layernorm import layernorm

    return layernorm(inp["x"], inp["weight"], inp["bias"], sketch=sketch)


def rope_inputs(shape, dtype, g):
    # shape (rows, n) of the generic tests -> x (seq=rows, heads, d) with d even
    seq, n = shape[0], shape[-1]
    heads, d = (3, 2 * max(n // 6, 1)) if n > 1 else (1, 2)
    x = torch.randn(seq, heads, d, generator=g)
    # small positions: fp32 angles carry |ang| * 2^-24 absolute error, which the float64 math lacks
    # (large positions are tested against the fp32-angles variant below)
    pos = torch.randint(0, 64, (seq,), generator=g)
    return {"x": x.to(DT[dtype]), "positions": pos}, {"base": 10000.0}


def rope_ref(inp, params):
    x, pos = inp["x"].double(), inp["positions"].double()
    d = x.shape[-1]
    inv = 1.0 / params["base"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.cat([pos[:, None] * inv] * 2, -1)[:, None, :]  # (seq, 1, d)
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * ang.cos() + rot * ang.sin()


def rope_kernel(inp, params, sketch):
    from optwin.kernels.rope import rope

    return rope(inp["x"], inp["positions"], params["base"], sketch=sketch)


OPS = {
    # op: (inputs, float64 math, kernel, production variant compared against)
    "rmsnorm": (rms_inputs, rms_ref, rms_kernel, "fp32-acc"),
    "softmax": (softmax_inputs, softmax_ref, softmax_kernel, "torch"),
    "layernorm": (ln_inputs, ln_ref, ln_kernel, "torch"),
    "rope": (rope_inputs, rope_ref, rope_kernel, "fp32-angles"),
}


def _check(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> None:
    report = mismatch_report(got, want, atol, rtol)
    assert report is None, report


# ------------------------------------------------------------------ generic tests over OPS


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype,atol,rtol", VS_FLOAT64)
def test_kernel_matches_float64(op, shape, dtype, atol, rtol):
    make, ref, kernel, _ = OPS[op]
    inp, params = make(shape, dtype, seed(op, shape, dtype))
    y, buf = kernel(inp, params, sketch=True)
    assert y.dtype == DT[dtype] and y.shape == next(iter(inp.values())).shape
    _check(y, ref(inp, params), atol, rtol)
    close(read_sketch(op, buf, inp["x"].shape, params), ingest_sketch(op, inp, params))


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype,atol,rtol", VS_PRODUCTION)
def test_kernel_matches_production_variant(op, dtype, atol, rtol):
    make, _, _, variant = OPS[op]
    inp, params = make((7, 1025), dtype, seed(op, dtype, "prod"))
    got = run_variant(op, "triton", dtype, inp, params)
    _check(got, run_variant(op, variant, dtype, inp, params).double(), atol, rtol)


@pytest.mark.parametrize("op", list(OPS))
def test_sketch_flag_does_not_change_output(op):
    make, _, kernel, _ = OPS[op]
    inp, params = make((5, 300), "bfloat16", seed(op, "flag"))
    y1, buf = kernel(inp, params, sketch=True)
    y0, none = kernel(inp, params, sketch=False)
    assert none is None and buf is not None
    torch.testing.assert_close(y0, y1, rtol=0, atol=0, equal_nan=True)  # bit-identical


@pytest.mark.parametrize("op", list(OPS))
def test_sketch_counts_nonfinite_and_ignores_them_in_magnitudes(op):
    make, _, kernel, _ = OPS[op]
    inp, params = make((4, 37), "float32", seed(op, "nan"))
    x = inp["x"]
    flat = x.view(-1)  # rows of 37 for rmsnorm/softmax/layernorm; rope's x is (4, 3, 12)
    flat[3], flat[74], flat[110] = float("nan"), float("inf"), -float("inf")
    flat[116] = 1e4  # the largest finite value
    _, buf = kernel(inp, params, sketch=True)
    got = read_sketch(op, buf, x.shape, params)
    want = ingest_sketch(op, inp, params)
    close(got, want)
    assert got["absmax"] == 1e4
    assert got["nonfinite"] == (2 if op == "softmax" else 3)  # -inf is a mask for softmax


# ------------------------------------------------------------------ op-specific


def test_rmsnorm_weight_sketch_and_row_rms():
    from optwin.kernels.rmsnorm import rmsnorm

    x = torch.ones(3, 16)
    x[1] *= 10.0
    w = torch.ones(16)
    w[7] = -5.0
    w[8] = float("nan")
    y, buf = rmsnorm(x, w)
    s = read_sketch("rmsnorm", buf, x.shape)
    assert s["max_row_rms"] == pytest.approx(10.0) and s["weight_absmax"] == 5.0 and s["nonfinite"] == 1.0
    assert torch.isnan(y[:, 8]).all() and torch.allclose(y[:, 7], torch.full((3,), -5.0))


def test_empty_rows_give_a_zero_sketch():
    from optwin.kernels.rmsnorm import rmsnorm

    x, w = torch.empty(0, 8), torch.full((8,), 2.0)
    y, buf = rmsnorm(x, w)
    s = read_sketch("rmsnorm", buf, x.shape)
    assert y.shape == (0, 8) and s["absmax"] == 0 and s["rms"] == 0 and s["weight_absmax"] == 2.0


def test_mismatch_report_names_count_indices_and_nan():
    want = torch.zeros(4, 4, dtype=torch.float64)
    got = torch.zeros(4, 4)
    got[1, 2] = 0.5
    got[3, 3] = float("nan")
    rep = mismatch_report(got, want, 1e-3, 1e-3)
    assert rep is not None and rep.startswith("2/16 elements differ") and "(1, 2)" in rep and "NaN mismatches 1" in rep
    assert mismatch_report(want.float(), want, 0, 0) is None


def test_softmax_masked_rows_and_out_dtype():
    from optwin.kernels.softmax import softmax

    x = torch.randn(4, 6, generator=seed("mask")).half()
    x[2] = -math.inf
    x[0, :3] = -math.inf
    y, buf = softmax(x, out_dtype=torch.float32)
    assert y.dtype == torch.float32 and torch.isnan(y[2]).all() and (y[0, :3] == 0).all()
    s = read_sketch("softmax", buf, x.shape)
    assert s["masked_rows"] == 1 and s["masked_frac"] == pytest.approx(9 / 24) and s["nonfinite"] == 0
    close(s, ingest_sketch("softmax", {"x": x}))
    assert torch.allclose(y[[0, 1, 3]], torch.softmax(x[[0, 1, 3]].double(), -1).float(), atol=1e-6)


def test_layernorm_sketch_constant_row_ratio_and_min_std():
    from optwin.kernels.layernorm import layernorm

    x = torch.randn(3, 64, generator=seed("ln")).float()
    x[0] = 7.0  # constant row: std 0, mean 7 -> const_absmax 7, not in the ratio
    x[1] = 1000.0 + x[1]  # |mean|/std ~ 1000
    w, b = torch.ones(64), torch.full((64,), -3.0)
    y, buf = layernorm(x, w, b)
    s = read_sketch("layernorm", buf, x.shape)
    assert s["const_absmax"] == 7.0 and 500 < s["max_mean_over_std"] < 2000
    assert s["min_row_std"] == 0.0 and s["bias_absmax"] == 3.0
    close(s, ingest_sketch("layernorm", {"x": x, "weight": w, "bias": b}), rtol=1e-4)
    assert torch.allclose(y[0], torch.full((64,), -3.0))  # (h - m) == 0 exactly, y = bias


def test_rope_large_positions_match_fp32_angles_variant():
    g = seed("rope-large")
    x = torch.randn(9, 4, 32, generator=g)
    pos = torch.tensor([0, 1, 100, 4095, 4096, 20000, 65535, 131071, 500000])
    inp = {"x": x, "positions": pos}
    got = run_variant("rope", "triton", "float32", inp, {"base": 10000.0})
    want = run_variant("rope", "fp32-angles", "float32", inp, {"base": 10000.0})
    _check(got, want.double(), 1e-5, 1e-5)  # same fp32 table and fp32 product: same angles
    from optwin.kernels.rope import rope

    _, buf = rope(x, -pos, 500.0)
    s = read_sketch("rope", buf, x.shape, {"base": 500.0})
    assert s["max_pos"] == 500000 and s["base"] == 500.0
    close(s, ingest_sketch("rope", {"x": x, "positions": -pos}, {"base": 500.0}))


def test_rope_from_tables_matches_hf_rotary():
    from optwin.kernels.production import rotate_half
    from optwin.kernels.rope import rope_from_tables

    g = seed("tables")
    q = torch.randn(2, 3, 5, 8, generator=g).to(torch.bfloat16)  # (B, H, S, D)
    ang = torch.rand(1, 5, 4, generator=g) * 10
    emb = torch.cat([ang, ang], -1)  # (1, S, D)
    cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
    want = q.double() * cos[:, None].double() + rotate_half(q).double() * sin[:, None].double()
    _check(rope_from_tables(q, cos, sin)[0], want, 1.6e-2, 1.6e-2)
    # a non-contiguous (B, S, H, D)-transposed view, as HF passes it
    qt = torch.randn(2, 5, 3, 8, generator=g).to(torch.bfloat16).transpose(1, 2)
    want = qt.double() * cos[:, None].double() + rotate_half(qt).double() * sin[:, None].double()
    _check(rope_from_tables(qt, cos, sin)[0], want, 1.6e-2, 1.6e-2)


def test_softmax_peaked_frac_counts_low_entropy_rows():
    from optwin.catalog import DEFAULT_TOLERANCES
    from optwin.kernels.softmax import softmax

    n = 64
    x = torch.randn(9, n, generator=seed("peaked")) * 0.1  # near-uniform rows: H ~ log 64 = 4.2
    x[0, 5] = 30.0  # one dominant entry: H ~ 0
    x[1, :] = -math.inf
    x[1, 7] = 2.0  # one finite entry among masks: H = 0 exactly
    x[2] = -math.inf  # fully masked: not eligible
    x[3, 4] = float("nan")  # NaN: not eligible
    x[4, 9] = float("inf")  # +inf: not eligible
    x[5, :32] = -math.inf  # masks in a flat row: H ~ log 32
    x[6, 3] = 1e20  # finite, but h*h overflows fp32: the exact path, still eligible and peaked
    x[7, :2] = torch.tensor([8.0, 8.0])  # two equal peaks: H ~ log 2 = 0.69 > 0.3, not peaked
    _, buf = softmax(x)
    s = read_sketch("softmax", buf, x.shape)
    # eligible rows 0, 1, 5, 6, 7, 8; peaked rows 0, 1, 6
    assert DEFAULT_TOLERANCES.low_entropy_nats == 0.3 and s["peaked_frac"] == pytest.approx(3 / 6)
    # the default layout's slow path sums squares in float64: 1e20^2 no longer overflows rms
    close(s, ingest_sketch("softmax", {"x": x}))
    _, buf = softmax(torch.full((2, 3), -math.inf))
    assert read_sketch("softmax", buf, (2, 3))["peaked_frac"] == 0.0  # no eligible row


@pytest.mark.parametrize("variant", [3, 4, 8])
def test_softmax_sketch_variants_agree_on_special_rows(variant):
    """Every sketch layout (softmax.LAYOUTS) gives the same y as no sketch and ingest's features,
    with NaN/+inf, huge, fully masked and partly masked rows spread over several programs."""
    from optwin.kernels.sketch_buffer import new_buffer
    from optwin.kernels.softmax import _softmax_launch

    g = seed("variants")
    x = torch.randn(11, 300, generator=g) * torch.logspace(0, 2, 11)[:, None]
    x[1, 17] = float("nan")
    x[2, 3] = float("inf")
    x[3] = -math.inf
    x[4, :150] = -math.inf
    x[5, 40] = 1e20  # squares overflow fp32
    x[6, 41] = -3e17  # above BIG (2**55): the slow path, squares still fp32-finite per lane
    x[7, :299] = -math.inf
    x = x.to(torch.bfloat16)
    y1, y0 = torch.empty_like(x), torch.empty_like(x)
    buf = new_buffer("softmax", x.device)
    _softmax_launch(x, y1, buf, variant=variant)
    _softmax_launch(x, y0, None, variant=variant)
    assert torch.equal(y1.view(torch.int16), y0.view(torch.int16))
    got, want = read_sketch("softmax", buf, x.shape), ingest_sketch("softmax", {"x": x})
    assert got["nonfinite"] == 2 and got["masked_rows"] == 1
    close(got, want)  # rms included: every layout's slow path sums squares in float64 (1e20^2 fits)


def test_softmax_layouts_are_the_kernels_and_others_are_refused():
    """Layouts measured and dropped (0-2, 5-7; history in softmax.py) are an error, not a silent fallback."""
    from optwin.errors import InputError
    from optwin.kernels.sketch_buffer import new_buffer
    from optwin.kernels.softmax import LAYOUTS, VARIANT, _softmax_launch

    assert LAYOUTS == (3, 4, 8, 10) and VARIANT in LAYOUTS
    x = torch.randn(3, 16, generator=seed("layouts"))
    for v in (0, 1, 2, 5, 6, 7, 9):
        with pytest.raises(InputError, match=f"no sketch layout {v} "):
            _softmax_launch(x, torch.empty_like(x), new_buffer("softmax", x.device), variant=v)
    y0, y1 = torch.empty_like(x), torch.empty_like(x)
    _softmax_launch(x, y0, None, variant=5)  # no sketch: the variant is not read
    _softmax_launch(x, y1, None)
    assert torch.equal(y0, y1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_softmax_peaked_frac_matches_ingest_on_a_spread_of_entropies(dtype):
    from optwin.kernels.softmax import softmax

    g = seed("peaked-spread", dtype)
    scale = torch.logspace(-1, 1.5, 40)[:, None]  # temperatures from flat to peaked rows
    x = (torch.randn(40, 200, generator=g) * scale).to(DT[dtype])
    x[::5, 10:20] = -math.inf
    _, buf = softmax(x)
    got = read_sketch("softmax", buf, x.shape)
    want = ingest_sketch("softmax", {"x": x})
    assert 0.1 < want["peaked_frac"] < 0.9  # both kinds of rows present
    close(got, want)


def test_layernorm_exact_pass_after_the_loop():
    """Rows with NaN, inf and a finite square overflow are redone exactly after the loop; y is the same
    with and without the sketch."""
    from optwin.kernels.layernorm import EPS, _layernorm_launch
    from optwin.kernels.sketch_buffer import new_buffer

    inp, _ = ln_inputs((6, 45), "float32", seed("ln-after"))
    x = inp["x"]
    x[1, 3], x[4, 0], x[4, 7] = float("nan"), float("inf"), 3e20  # NaN, inf, a finite square overflow
    y, buf = torch.empty_like(x), new_buffer("layernorm", x.device)
    _layernorm_launch(x, inp["weight"], inp["bias"], y, buf, EPS)
    y0 = torch.empty_like(x)
    _layernorm_launch(x, inp["weight"], inp["bias"], y0, None, EPS)
    torch.testing.assert_close(y, y0, rtol=0, atol=0, equal_nan=True)
    got = read_sketch("layernorm", buf, x.shape)
    want = ingest_sketch("layernorm", inp)
    assert got["nonfinite"] == 2 and got["absmax"] == float(torch.tensor(3e20))  # float32 of 3e20
    assert math.isfinite(got["rms"])  # the exact pass squares in float64: (3e20)^2 does not overflow
    close(got, want)


@pytest.mark.parametrize("n", [45, 5000])
def test_rmsnorm_exact_pass_squares_past_fp32(n):
    """A finite |x| past 1.8e19 overflows an fp32 square: the row takes the exact pass, whose float64
    squares give ingest's rms and max row rms (before: inf). 5000 columns with chunk 1024: the chunked kernel."""
    from optwin.kernels.rmsnorm import EPS, _rmsnorm_launch
    from optwin.kernels.sketch_buffer import new_buffer

    g = seed("rms-big", n)
    x, w = torch.randn(6, n, generator=g), torch.randn(n, generator=g)
    x[1, 3], x[4, 0], x[4, 7] = float("nan"), 3e20, -2e19
    buf = new_buffer("rmsnorm", x.device)
    _rmsnorm_launch(x, w, torch.empty_like(x), buf, EPS, chunk=1024 if n > 1024 else None)
    got, want = read_sketch("rmsnorm", buf, x.shape), ingest_sketch("rmsnorm", {"x": x, "weight": w})
    assert math.isfinite(got["rms"]) and math.isfinite(got["max_row_rms"]) and got["nonfinite"] == 1
    close(got, want)


def test_rope_head_blocks_match_one_tile_per_position():
    from optwin.kernels.rope import _inv_freq, _rope_launch
    from optwin.kernels.sketch_buffer import new_buffer

    g = seed("rope-blocks")
    x = torch.randn(5, 6, 16, generator=g)  # heads 6: blocks of 4 leave a partial block
    x[2, 5, 3] = float("nan")
    pos = torch.tensor([3, 0, 17, 9, 250])
    out = []
    for bh in (8, 4, 2):
        y, buf = torch.empty_like(x), new_buffer("rope", x.device)
        _rope_launch(x.unsqueeze(0), y.unsqueeze(0), buf, positions=pos.unsqueeze(0), inv=_inv_freq(16, 1e4, x.device),
                     base=1e4, block_h=bh)
        out.append((y, read_sketch("rope", buf, x.shape, {"base": 1e4})))
    for y, s in out[1:]:
        torch.testing.assert_close(y, out[0][0], rtol=0, atol=0, equal_nan=True)
        close(s, out[0][1], rtol=1e-6)
    close(out[0][1], ingest_sketch("rope", {"x": x, "positions": pos}, {"base": 1e4}))


def test_rope_cos_sin_slots_alternate_across_a_programs_tiles():
    """The angle mode's cos/sin go through two per-program slots (sketch_buffer.scratch): one program
    walking every tile (the slots reused 40 times) gives the y of a program per tile, and the spec's
    float32 rotation."""
    from optwin.kernels.rope import _inv_freq, _rope_launch
    from optwin.kernels.sketch_buffer import scratch

    g = seed("rope-slots")
    x = torch.randn(40, 3, 12, generator=g)
    pos = torch.randint(0, 5000, (40,), generator=g)
    inv = _inv_freq(12, 1e4, x.device)
    ys = []
    for per_sm in (1, 64):  # one program a tile at 64 (the CPU device counts one SM)
        y = torch.empty_like(x)
        _rope_launch(x.unsqueeze(0), y.unsqueeze(0), None, positions=pos.unsqueeze(0), inv=inv, per_sm=per_sm)
        ys.append(y)
    torch.testing.assert_close(ys[0], ys[1], rtol=0, atol=0)
    ang = pos.float()[:, None] * inv[None, :]  # (seq, d/2) float32, as the kernel's product
    c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., :6], x[..., 6:]
    torch.testing.assert_close(ys[0], torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1), rtol=1e-6, atol=1e-6)
    assert scratch("rope-trig", x.device, 1).numel() >= 64 * 4 * 8  # the grid's slots, 4 * BLOCK_D floats each


def test_scratch_grows_and_keeps_what_it_outgrew():
    from optwin.kernels import sketch_buffer

    small = sketch_buffer.scratch("test-scratch", torch.device("cpu"), 10)
    assert small.numel() == 16 and sketch_buffer.scratch("test-scratch", torch.device("cpu"), 16) is small
    big = sketch_buffer.scratch("test-scratch", torch.device("cpu"), 17)
    assert big.numel() == 32 and any(b is small for b in sketch_buffer._OUTGROWN)  # a captured graph may still write it


@pytest.mark.parametrize("tables", [False, True])
def test_rope_batches_of_positions_match_the_float32_rotation(tables):
    """Batch 2 with positions (or cos/sin tables) of their own, one program walking every position (its
    cos/sin slots reused) or a program each, a NaN for the exact pass: the same y and sketch, and the
    spec's float32 rotation."""
    from optwin.kernels.rope import _inv_freq, _rope_launch
    from optwin.kernels.sketch_buffer import new_buffer

    g = seed("rope-batches")
    x = torch.randn(2, 19, 3, 10, generator=g)  # (batch, seq, heads, d)
    x[1, 7, 2, 4] = float("nan")
    pos = torch.randint(0, 3000, (2, 19), generator=g)
    inv = _inv_freq(10, 1e4, x.device)
    ang = pos.float()[..., None] * inv  # (batch, seq, d/2)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    out = []
    for per_sm in (1, 64):
        y, buf = torch.empty_like(x), new_buffer("rope", x.device)
        if tables:
            _rope_launch(x, y, buf, cos=cos, sin=sin, per_sm=per_sm)
        else:
            _rope_launch(x, y, buf, positions=pos, inv=inv, base=1e4, per_sm=per_sm)
        out.append((y, read_sketch("rope", buf, x.shape, {"base": 1e4})))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=0, atol=0, equal_nan=True)
    close(out[1][1], out[0][1], rtol=1e-6)
    x1, x2 = x[..., :5], x[..., 5:]
    c, s_ = cos[:, :, None, :5], sin[:, :, None, :5]
    want = torch.cat([x1 * c - x2 * s_, x2 * c + x1 * s_], -1)
    torch.testing.assert_close(out[0][0], want, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert out[0][1]["nonfinite"] == 1 and out[0][1]["max_pos"] == (0 if tables else float(pos.max()))
