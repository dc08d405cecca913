"""The Triton norms' tl.sum order (optwin.twin.triton_reduce) by hand and against an H100, row by row.

triton 3.6 (the device's) adds a thread's own registers in one chain, then the lanes' butterfly, then the warps'.
Before stop 49 the twin added a row as one halving tree over its elements, where a float32 constant row's sum of
c never rounds: it missed the H100's faulting triton float32 rows (1015 of 1280 rows agreed; 97 of 97 faulting rows
missed at width 1024). bench/gpu_constant_rows.py stored the H100's outcome of 256 rows a width (bench/results/).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from optwin import twin
from optwin.twin.numerics import Numerics
from optwin.twin.triton_reduce import ELEMENT_BYTES, row_layout, tl_sum

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu_constant_rows import rows_of  # noqa: E402

GPU = json.loads((ROOT / "bench" / "results" / "constant_rows_gpu_h100_s48.json").read_text())
TAU32 = 16 * 2.0**-24  # bench/twin_constant_rows.py's per-row fault threshold for float32
HALF_ULP = 2.0**-24  # half an ulp of 1.0 in float32: 1 + HALF_ULP is a tie that rounds to even, 1


def _halving(x: torch.Tensor) -> torch.Tensor:
    """The order the twin used before: one halving tree over the (zero-padded) elements, in float32."""
    x = x.float()
    while x.shape[-1] > 1:
        x = x[..., : x.shape[-1] // 2] + x[..., x.shape[-1] // 2:]
    return x[..., 0].double()


def test_a_thread_adds_its_registers_in_one_chain() -> None:
    # block 8 at spt 4: thread 0 holds 1, 0, h, 0 and thread 1 0, 0, h, 0. Thread 0's chain 1 + h rounds to 1 (a
    # tie, to even), then the lanes' 1 + h again: 1. The old halving tree adds the h's first (elements 2 and 6):
    # 1 + 2h = 1 + 2^-23, exact.
    x = torch.tensor([[1.0, 0, HALF_ULP, 0, 0, 0, HALF_ULP, 0]], dtype=torch.float64)
    assert tl_sum(Numerics(), x, 8, 1, 4).item() == 1.0
    assert _halving(x).item() == 1.0 + 2 * HALF_ULP
    # one thread holding 1, 0, h, h: the chain rounds twice to 1, where triton 3.9's in-thread pairwise tree
    # (1 + 0) + (h + h) keeps 1 + 2h
    one = torch.tensor([[1.0, 0, HALF_ULP, HALF_ULP]], dtype=torch.float64)
    assert tl_sum(Numerics(), one, 4, 1, 4).item() == 1.0
    f = one.float()
    assert ((f[0, 0] + f[0, 1]) + (f[0, 2] + f[0, 3])).item() == 1.0 + 2 * HALF_ULP


def test_the_lanes_butterfly_runs_before_the_warps() -> None:
    # block 64 at spt 1 over 2 warps: element i is lane i % 32 of warp i // 32. Warp 1 adds h + h (lanes 0 and 16)
    # exactly, then warp 0's 1 + 2h is exact; a halving tree over all 64 first adds 1 + h (elements 0 and 32): 1.
    x = torch.zeros(1, 64, dtype=torch.float64)
    x[0, 0], x[0, 32], x[0, 48] = 1.0, HALF_ULP, HALF_ULP
    assert tl_sum(Numerics(), x, 64, 2, 1).item() == 1.0 + 2 * HALF_ULP
    assert _halving(x).item() == 1.0


@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_row_layout_is_the_kernels_launch(op: str, dtype: str) -> None:
    # The twin keeps its own copy of the launch rule (it does not import the kernels): it must stay the launcher's.
    from optwin.kernels._common import launch_config, lane_shape

    for k in range(0, 17):
        n = 1 << k
        block, warps, spt = row_layout(n, dtype, op)
        launch = launch_config(op, n, esize=ELEMENT_BYTES[dtype])
        assert (block, warps) == (launch.block, launch.warps), (op, dtype, n)
        vec, _ = lane_shape(block, ELEMENT_BYTES[dtype], warps)  # the 16-byte vector the load takes
        assert spt == min(vec, max(block // (32 * warps), 1))


@pytest.mark.parametrize("width", [768, 1024, 2048])
def test_float32_constant_rows_fault_where_the_h100_did(width: int) -> None:
    res = GPU["results"][f"triton/float32/{width}"]
    inp = rows_of("float32", width, GPU["rows"])
    gpu = torch.tensor([bool(b) or e > TAU32 for b, e in zip(res["nonfinite"], res["rel_error"])])  # (rows,)
    # the rows the old order missed: a halving tree's sum of c is exact, so its mean was c and y the bias
    h = inp["x"].double()
    block = 1 << (width - 1).bit_length()
    old_exact = (_halving(torch.nn.functional.pad(h, (0, block - width))) / width).float().double() == h[:, 0]
    missed = gpu & old_exact
    assert int(missed.sum()) >= 40, int(missed.sum())
    r = twin.run("layernorm", "triton", "float32", inp)
    err = (r.emulated - r.exact).norm(dim=-1) / r.exact.norm(dim=-1)
    faults = ~torch.isfinite(r.emulated).all(-1) | (err > TAU32)
    assert faults[missed].all()
    assert torch.equal(faults, gpu), f"{int((faults != gpu).sum())} rows of {len(gpu)} disagree"
    # the GPU's mean is the twin's: its error on a faulting row is the twin's but for the approximate rsqrt
    g = torch.tensor(res["rel_error"], dtype=torch.float64)
    assert torch.allclose(err[gpu], g[gpu], rtol=1e-3, atol=0)


LABELS = json.loads((ROOT / "bench" / "results" / "validate_gpu_h200_seed4.json").read_text())
OUTCOMES = {(c["op"], c["dtype"], int(c["case"])): c["outcomes"]["triton"] for c in LABELS["cases"]
            if "triton" in c["outcomes"]}


# seed-4 held-out cases (H200, triton 3.6) whose relative error the old order missed and this one gives to 1e-9:
# rmsnorm float16 at widths 256, 768, 1024 (its partials two a thread, or a butterfly over 2 warps) and float32;
# layernorm float32 at 64, 384 and 1024, where the old order also missed the fault flag (130, 167, 361)
@pytest.mark.parametrize("op,dtype,case", [("rmsnorm", "float16", 52), ("rmsnorm", "float16", 180),
                                           ("rmsnorm", "float16", 188), ("rmsnorm", "float32", 0),
                                           ("layernorm", "float32", 130), ("layernorm", "float32", 167),
                                           ("layernorm", "float32", 361), ("layernorm", "float32", 2)])
def test_held_out_cases_are_the_h200s(op: str, dtype: str, case: int) -> None:
    from optwin.validate.families import held_out_case

    out = OUTCOMES[(op, dtype, case)]
    c = held_out_case(op, dtype, case, int(LABELS["seed"]))
    r = twin.run(op, "triton", dtype, c.inputs, c.params)
    assert r.rel_error == pytest.approx(out["rel_error"], rel=1e-9, abs=0)
    assert any(r.faults.values()) == any(out["labels"].values())
