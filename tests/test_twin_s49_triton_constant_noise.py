"""triton float32 layernorm constant rows replay as their deterministic emulation up to CHECKED_WIDTH, as the
other variants' do (layernorm.noise_free_rows).

Until stop 49 the twin missed the order in which Triton sums a row held in registers, so these rows kept their
rounding noise; a8f0236 modelled it and the twin now flags the H100's faulting constant rows row by row (tests/
test_twin_s49_triton_order.py). The noise then only blurred a known answer: at width 1024 the H100 and the
emulation flag 97 of 256 rows alike, where a stochastic replay flagged 14 % of them on average. Width 4096 takes the Welford
kernel, whose merge order the twin does not model, but a constant row's deltas are all 0 (any order gives mean c,
M2 0, y = bias), and the H100 gave y = bias on all its 256 rows. Wider rows have no GPU rows: they keep the noise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from optwin import twin
from optwin.twin import layernorm
from optwin.twin.numerics import welford_chunk

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu_constant_rows import rows_of  # noqa: E402

GPU = json.loads((ROOT / "bench" / "results" / "constant_rows_gpu_h100_s48.json").read_text())
TAU32 = 16 * 2.0**-24  # bench/twin_constant_rows.py's per-row fault threshold for float32
REPLAYS = 16


def _row_faults(y: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Per row (..., rows): nonfinite, or ||y - r|| / ||r|| past TAU32 (bench/twin_constant_rows.py's rule)."""
    err = torch.nan_to_num((y - r).norm(dim=-1) / r.norm(dim=-1), nan=float("inf"))
    return ~torch.isfinite(y).all(-1) | (err > TAU32)


def _h100_rows(width: int, faulting: int, clean: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The first `faulting` rows the H100 flagged and `clean` it did not at this width: inputs, GPU flags (rows,)."""
    res = GPU["results"][f"triton/float32/{width}"]
    gpu = torch.tensor([bool(b) or e > TAU32 for b, e in zip(res["nonfinite"], res["rel_error"])])  # (256,)
    pick = torch.cat([gpu.nonzero()[:faulting, 0], (~gpu).nonzero()[:clean, 0]])
    inp = rows_of("float32", width, GPU["rows"])
    # triton's rows are independent programs: a subset of the launch's rows is computed as in the launch
    return {"x": inp["x"][pick], "weight": inp["weight"], "bias": inp["bias"]}, gpu[pick]


def test_register_kernel_rows_replay_as_the_h100() -> None:
    assert welford_chunk(1024) == 0  # held in registers: the tl.sum order triton_reduce models
    inp, gpu = _h100_rows(1024, faulting=4, clean=4)
    assert layernorm.noise_free_rows("triton", "float32", inp, {}) is not None
    r = twin.run("layernorm", "triton", "float32", inp, noise="stochastic", replays=REPLAYS, seed=0, keep_replays=True)
    assert torch.equal(r.replays, r.emulated.expand(REPLAYS, -1, -1))
    # every replay flags the H100's faulting rows and only them
    assert torch.equal(_row_faults(r.replays, r.exact), gpu.expand(REPLAYS, -1))


def test_welford_width_4096_rows_replay_as_the_h100() -> None:
    assert welford_chunk(layernorm.CHECKED_WIDTH) == 1024  # the Welford kernel, not the register one
    inp, gpu = _h100_rows(layernorm.CHECKED_WIDTH, faulting=0, clean=4)
    assert not gpu.any()
    assert layernorm.noise_free_rows("triton", "float32", inp, {}) is not None
    r = twin.run("layernorm", "triton", "float32", inp, noise="stochastic", replays=REPLAYS, seed=0, keep_replays=True)
    # mean c and M2 0 in any merge order: y is the bias, the H100's (relative error 0 on all 256 rows)
    assert torch.equal(r.replays, inp["bias"].double().expand_as(r.replays))


def test_rows_past_the_checked_width_keep_their_noise() -> None:
    width = layernorm.CHECKED_WIDTH + 4  # the register kernel (no Welford chunk divides it), at no GPU-checked width
    assert welford_chunk(width) == 0
    x = torch.randn(3, width, generator=torch.Generator().manual_seed(0))  # (3, width)
    x[1], x[2] = 37.3, -1234.5
    inp = {"x": x, "weight": torch.ones(width), "bias": torch.zeros(width)}
    assert layernorm.noise_free_rows("triton", "float32", inp, {}) is None
    r = twin.run("layernorm", "triton", "float32", inp, noise="stochastic", replays=REPLAYS, seed=1, keep_replays=True)
    assert (r.replays[:, 1:3] != r.emulated[1:3]).any()
