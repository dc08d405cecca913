"""The monitor clamps sketch features to FEATURE_CAP before the stream bins them, as call_sketch does.

    python -m pytest -q tests/test_monitor_feature_cap.py

softmax(x, dtype=torch.float16) of float64 logits near 1e307 is a float16 call whose sketch keeps the
float64 magnitudes (max = 1e307). The monitor handed the raw sketch_tensor values to
Stream.observe_valid, whose log binning overflowed (1e307 / 1e-3 is inf) and int(inf) raised
OverflowError: the call was counted as skipped and never assessed. Stream.observe (call_sketch)
clamps such a feature to FEATURE_CAP, past every replayed region, where the conservative rule answers.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import optwin.monitor as om


@pytest.mark.parametrize("async_readback", [False, True])  # read now, or from the queued host row
def test_a_sketch_past_the_cap_is_assessed_not_skipped(db, async_readback):
    x = torch.full((4, 32), 1e307, dtype=torch.float64)  # (4, 32); exp overflows float16 on any row
    with om.monitor(None, db=db, sampling="always", ops=("softmax",), variants={"softmax": "naive"},
                    async_readback=async_readback) as mon:
        F.softmax(x, -1, dtype=torch.float16)
    assert not mon._rec.skipped, dict(mon._rec.skipped)
    assert [w["reason"] for w in mon.warnings] == ["risk"]  # beyond every replayed cell: warned
    sk = next(iter(mon.last_sketches.values()))
    assert sk["max"] == 1e200  # FEATURE_CAP
