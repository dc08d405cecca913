"""An rms aim the capped rows can't reach leaves the other rows scaled down, never zeroed.

    python -m pytest -q tests/test_ingest_generate_rms_floor.py

With absmax=100, max_row_rms=20, rms=1 and 8 rows the top row alone gives an rms of 20/sqrt(8) > 1:
the other rows' scale came out 0, so samples had all-zero rows (layernorm: constant rows, a path
the capture never saw).
"""

from __future__ import annotations

import numpy as np
import torch

from optwin.ingest.generate import make_layernorm, make_rmsnorm

F32 = torch.float32


def _rows(case) -> np.ndarray:  # noqa: ANN001
    x = case.inputs["x"].double().numpy()
    return x.reshape(-1, x.shape[-1])


def test_rmsnorm_unreachable_rms_keeps_nonzero_rows() -> None:
    for seed in range(5):
        c = make_rmsnorm(np.random.default_rng(seed), F32, rows=8, hidden=256, family="normal", absmax=100.0,
                         max_row_rms=20.0, rms=1.0)
        assert "outlier-channels" in c.family
        x = _rows(c)
        assert (np.abs(x).max(-1) > 0).all(), np.abs(x).max(-1)
        assert np.isclose(np.abs(x).max(), 100.0, rtol=1e-5)


def test_layernorm_unreachable_rms_keeps_varying_rows() -> None:
    for seed in range(5):
        c = make_layernorm(np.random.default_rng(seed), F32, rows=8, hidden=256, family="normal",
                           max_mean_over_std=2.0, absmax=100.0, rms=1.0)
        x = _rows(c)
        assert (x.std(-1) > 0).all(), x.std(-1)  # no constant row the capture never had
