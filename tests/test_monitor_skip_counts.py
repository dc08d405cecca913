"""A monitor counts every call its handlers refuse in stats.skipped, not only in the recorder's `skipped`.

    python -m pytest -q tests/test_monitor_skip_counts.py

The handlers counted their refusals (a scaled addmm, an attention at another softmax scale, a norm over
more than the last dim) straight into Recorder.skipped, past Recorder.skip, so a monitor's
stats.skipped (documented as counting the calls it refused) read 0 for them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import optwin.monitor as om


class _Refused(nn.Module):
    """One call of each kind a handler refuses, before any sketch runs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (4, 16)
        y = torch.addmm(x[:, :4], x, x.T, alpha=0.5)  # a scaled product: not a catalog matmul
        q = x.reshape(1, 2, 4, 8)  # (batch, heads, seq, d)
        a = F.scaled_dot_product_attention(q, q, q, scale=1.0)  # not 1/sqrt(d)
        n = F.layer_norm(x.reshape(2, 2, 16), (2, 16))  # normalized over the last two dims
        return y.sum() + a.sum() + n.sum()


def test_monitor_counts_refused_calls_in_stats_skipped(db: str) -> None:
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    m = _Refused()
    with torch.no_grad(), om.monitor(m, db=db, sampling="always") as mon:
        m(x)
    skipped = dict(mon._rec.skipped)
    assert sum(skipped.values()) == 3, skipped
    assert any(k.startswith("matmul: addmm with alpha") for k in skipped), skipped
    assert any(k.startswith("attention: softmax scale") for k in skipped), skipped
    assert any(k.startswith("layernorm: normalized over more") for k in skipped), skipped
    assert mon.stats.skipped == 3, (mon.stats, skipped)
