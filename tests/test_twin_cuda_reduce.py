"""torch.mean's CUDA reduce order (Numerics._cuda_reduce) against an H100, row by row.

One-pass layernorm's constant rows are a sharp test of the order: E[h^2] sums copies of fp32(c^2), which round,
and whether E[h^2] - m^2 lands below -eps (NaN) depends on which partial sums the kernel forms and in what order.
bench/gpu_constant_rows.py stored the H100's outcome of 256 rows a width (bench/results/); the twin, given the
same rows in one call (the reduce sizes its blocks by the rows of a launch), must NaN on exactly those rows.
The "blocked" order over 256 lanes that stood before missed 18 of 256 at width 2048 and 90 of 256 at 4096.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from optwin import twin
from optwin.twin.numerics import Numerics

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu_constant_rows import rows_of  # noqa: E402

GPU = json.loads((ROOT / "bench" / "results" / "constant_rows_gpu_h100_s48.json").read_text())


@pytest.mark.parametrize("dtype,width", [("float16", 768), ("float16", 2048), ("float16", 4096), ("float32", 1024)])
def test_one_pass_constant_rows_nan_where_the_h100_did(dtype: str, width: int) -> None:
    res = GPU["results"][f"one-pass/{dtype}/{width}"]
    r = twin.run("layernorm", "one-pass", dtype, rows_of(dtype, width, GPU["rows"]))
    nan = ~torch.isfinite(r.emulated).all(-1)  # (rows,)
    assert nan.tolist() == res["nonfinite"], f"{int(nan.sum())} NaN rows against the H100's {sum(res['nonfinite'])}"


def test_the_block_width_follows_the_rows_of_the_call() -> None:
    # 4 accumulators per thread; 256 threads a row when 2 rows share a block, 32 once 16 or more do
    x = (torch.arange(1, 4097, dtype=torch.float64) / 3).float().double()  # (4096,): sums that round
    num = Numerics()
    two = num.sum(x.expand(2, -1), order="cuda", outputs=2)
    many = num.sum(x.expand(64, -1), order="cuda", outputs=64)
    assert two[0] != many[0]  # the order changes with the launch, as torch's does
    assert torch.equal(two, two[:1].expand(2)) and torch.equal(many, many[:1].expand(64))


def test_edges_of_the_modelled_order() -> None:
    num = Numerics()
    # torch's accumulators start at +0: a row of -0.0 sums to +0.0
    s = num.sum(torch.full((16, 256), -0.0, dtype=torch.float64), order="cuda", outputs=16)
    assert torch.equal(s, torch.zeros(16, dtype=torch.float64)) and not s.signbit().any()
    with pytest.raises(ValueError, match="last dim"):
        num.sum(torch.ones(4, 256, dtype=torch.float64), dim=0, order="cuda", outputs=256)
    # one row torch also splits over blocks (131072 float32: 256 elements a thread of 512) takes "blocked", as
    # documented; rows split over a block's warps only are modelled (tests/test_twin_s49_cuda_reduce.py)
    x = torch.randn(1, 131072, generator=torch.Generator().manual_seed(0), dtype=torch.float64).float().double()
    assert torch.equal(num.sum(x, order="cuda", outputs=1), num.sum(x, order="blocked", lanes=256))
