"""layernorm's exactly constant rows take the deterministic emulation in every noisy replay (twin.run).

Noise stands in for the orders and roundings the emulation cannot pin down; a constant row has none. Before
TWIN_VERSION 6, stochastic rounding of the one-pass mean's s * fp32(1/n) sent E[h^2] - m^2 below -eps (NaN in
most replays of a constant row at width 384) and the torch variant's uneven merges off by ulps (precision_loss),
where the H200 never faults: the seed-4 labels' false warnings (bench/RESULTS.md, validate, stop 47).
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


@pytest.mark.parametrize("variant", ["one-pass", "torch"])
@pytest.mark.parametrize("noise", ["stochastic", "mca"])
def test_constant_rows_replay_as_the_emulation(variant: str, noise: str) -> None:
    inputs = _inputs(torch.float16)
    r = twin.run("layernorm", variant, "float16", inputs, noise=noise, replays=48, seed=1, keep_replays=True)
    assert not any(r.faults.values())
    assert all(int(v.sum()) == 0 for v in r.replay_faults.values()), {k: int(v.sum()) for k, v in r.replay_faults.items()}
    # the constant rows are the emulation bit for bit; the other rows still carry the noise
    assert torch.equal(r.replays[:, 1:3], r.emulated[1:3].expand(48, -1, -1))
    assert (r.replays[:, 0] != r.emulated[0]).any()


def test_only_constant_rows_are_noise_free() -> None:
    rows = layernorm.noise_free_rows(_inputs(torch.bfloat16), {})
    assert rows is not None and rows.squeeze(-1).tolist() == [False, True, True, False]
    x = torch.randn(3, 8, dtype=torch.float64)  # no constant row
    assert layernorm.noise_free_rows({"x": x}, {}) is None
    assert layernorm.noise_free_rows({"x": torch.empty(0, 8, dtype=torch.float64)}, {}) is None
