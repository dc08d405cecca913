"""capture(max_calls=N) keeps the first N calls and counts the rest in `skipped`: a bounded capture.

    python -m pytest -q tests/test_ingest_capture_max_calls.py

Every recorded call is kept (~2.7 KB with records()), so a long generate under capture reached
gigabytes; there was no way to bound it.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from optwin.ingest.capture import capture


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8))


def test_max_calls_keeps_the_first_calls_and_counts_the_rest() -> None:
    m, x = _model(), torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = m(x)
        with capture(m, max_calls=5, sample_rate=1.0) as rec:
            outs = [m(x) for _ in range(4)]  # 12 calls: matmul, layernorm, matmul per forward
    assert all(torch.equal(o, ref) for o in outs)  # a full capture still never changes outputs
    recs = rec.records()
    assert [r["call_index"] for r in recs] == list(range(5))
    assert [r["op"] for r in recs] == ["matmul", "layernorm", "matmul", "matmul", "layernorm"]
    full = Counter({k.split(":")[0]: n for k, n in rec.skipped.items() if "past max_calls=5" in k})
    assert full == {"matmul": 5, "layernorm": 2} and sum(rec.skipped.values()) == 7, dict(rec.skipped)
    assert max(s.call_index for s in rec.all_samples()) < 5  # samples come only from recorded calls


def test_without_max_calls_every_call_is_kept() -> None:
    m, x = _model(), torch.randn(4, 16)
    with torch.no_grad(), capture(m) as rec:
        for _ in range(4):
            m(x)
    assert len(rec.records()) == 12 and not rec.skipped


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "10"])
def test_bad_max_calls_is_one_clear_error(bad) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="max_calls must be a whole number >= 1 or None"):
        with capture(max_calls=bad):
            pass
