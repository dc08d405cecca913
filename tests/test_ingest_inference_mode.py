"""Capture and the sketch's WeightCache under torch.inference_mode (inference tensors have no version counter).

    python -m pytest -q tests/test_ingest_inference_mode.py
"""

from __future__ import annotations

import torch

from optwin.ingest.capture import capture
from optwin.ingest.sketch import WeightCache, sketch_tensor


def test_capture_records_matmuls_under_inference_mode() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16)
    with torch.inference_mode(), capture(lin) as rec:
        for _ in range(3):
            lin(torch.randn(4, 16))
    assert dict(rec.skipped) == {}
    assert [r["op"] for r in rec.records()] == ["matmul"] * 3


def test_weight_cache_rereads_inference_tensors_written_in_place() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 4, generator=g)  # a normal tensor: its statistics may be memoized
    cache = WeightCache()
    with torch.inference_mode():
        a = torch.randn(3, 8, generator=g)  # an inference tensor
        _, v1 = sketch_tensor("matmul", {"a": a, "b": w}, cache=cache)
        a.mul_(10.0)  # in place inside inference mode: no version bump to key on
        _, v2 = sketch_tensor("matmul", {"a": a, "b": w}, cache=cache)
        _, v3 = sketch_tensor("matmul", {"a": a, "b": w}, exact=True)
    assert torch.allclose(v2, v3, rtol=2e-6) and not torch.allclose(v1, v2)
