"""layernorm's exactly constant rows take the deterministic emulation in every noisy replay (twin.run) where that
emulation is the GPU's row for row: every variant and dtype (H100, bench/twin_constant_rows.py), one-pass and triton
float32 up to layernorm.CHECKED_WIDTH.

Before TWIN_VERSION 6, stochastic rounding NaN'd most one-pass replays of a constant row at widths 384/768 and sent
the torch variant's uneven merges off by ulps, where the GPU gives neither: the seed-4 labels' false warnings
(bench/RESULTS.md, validate, stops 47-48). triton's float32 sums of c rounded in an order the twin missed and kept
their noise until stop 49 modelled it (tests/test_twin_s49_triton_constant_noise.py).
"""

from __future__ import annotations

import pytest
import torch

from optwin import twin
from optwin.twin import layernorm


def _inputs(dtype: torch.dtype, hidden: int = 384) -> dict[str, torch.Tensor]:
    x = torch.randn(4, hidden, generator=torch.Generator().manual_seed(0)).to(dtype)  # (4, hidden)
    x[1] = 37.3  # constant rows: |c| large enough that one ulp of c^2 is far above eps
    x[2] = -1234.5
    return {"x": x, "weight": torch.ones(hidden).to(dtype), "bias": torch.zeros(hidden).to(dtype)}


@pytest.mark.parametrize("variant,dtype", [("torch", "float16"), ("torch", "bfloat16"), ("torch", "float32"),
                                           ("triton", "float16"), ("triton", "float32"), ("one-pass", "float16"),
                                           ("one-pass", "bfloat16")])
@pytest.mark.parametrize("noise", ["stochastic", "mca"])
def test_constant_rows_replay_as_the_emulation(variant: str, dtype: str, noise: str) -> None:
    inputs = _inputs(getattr(torch, dtype))
    r = twin.run("layernorm", variant, dtype, inputs, noise=noise, replays=48, seed=1, keep_replays=True)
    # the constant rows are the emulation bit for bit; the other rows still carry the noise
    assert torch.equal(r.replays[:, 1:3], r.emulated[1:3].expand(48, -1, -1))
    assert (r.replays[:, 0] != r.emulated[0]).any()
    if dtype != "float32":
        assert not any(r.faults.values())
        assert all(int(v.sum()) == 0 for v in r.replay_faults.values()), {k: int(v.sum()) for k, v in r.replay_faults.items()}


@pytest.mark.parametrize("variant,dtype", [("triton", "float32"), ("one-pass", "float16")])
def test_constant_rows_keep_their_noise_past_the_checked_width(variant: str, dtype: str) -> None:
    """Until stop 49 triton float32 constant rows kept their noise at every width: the twin missed the order Triton
    sums a row in. It models it now and the H100's rows agree up to CHECKED_WIDTH (bench/twin_constant_rows.py);
    wider rows, unchecked on a GPU, keep the noise, as one-pass's do (torch's reduce may split them)."""
    inputs = _inputs(getattr(torch, dtype), hidden=layernorm.CHECKED_WIDTH + 4)
    assert layernorm.noise_free_rows(variant, dtype, inputs, {}) is None
    r = twin.run("layernorm", variant, dtype, inputs, noise="stochastic", replays=48, seed=1, keep_replays=True)
    assert (r.replays[:, 1:3] != r.emulated[1:3]).any()


def test_only_constant_rows_are_noise_free() -> None:
    rows = layernorm.noise_free_rows("torch", "bfloat16", _inputs(torch.bfloat16), {})
    assert rows is not None and rows.squeeze(-1).tolist() == [False, True, True, False]
    x = torch.randn(3, 8, dtype=torch.float64)  # no constant row
    assert layernorm.noise_free_rows("torch", "float32", {"x": x}, {}) is None
    assert layernorm.noise_free_rows("torch", "float32", {"x": torch.empty(0, 8, dtype=torch.float64)}, {}) is None
