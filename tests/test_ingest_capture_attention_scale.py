"""Attention calls with a softmax scale other than 1/sqrt(d) are skipped (counted, warned once), not mis-sketched.

    python -m pytest -q tests/test_ingest_capture_attention_scale.py

The catalog's attention (../shared/spec/operators.md, optwin.catalog) has no scale param: the sketch
and every twin scale the scores by 1/sqrt(d). sdpa(..., scale=1.0) was recorded with the scores of
1/sqrt(64) = 0.125: peaked_frac 0.0 where the call's rows are 45 % peaked, so the fingerprints were
looked up for another call. HF eager attention passes the model's `scaling` the same way.
"""

from __future__ import annotations

import importlib
import logging
import math

import pytest
import torch
import torch.nn.functional as F

from optwin.ingest.capture import capture
from optwin.ingest.models import load_llama_tiny

# the module (optwin.ingest's `capture` attribute is the function once optwin.monitor has been imported)
capture_mod = importlib.import_module("optwin.ingest.capture")


def _qkv() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 4, 16, 64, generator=g) for _ in range(3))  # (batch, heads, seq, d)


def _attention(rec) -> list[dict]:  # noqa: ANN001
    return [r for r in rec.records() if r["op"] == "attention"]


def test_sdpa_with_its_own_scale_is_skipped_and_warned_once(caplog, monkeypatch):
    monkeypatch.setattr(capture_mod, "_SCALE_WARNED", False)  # once per process: an earlier test may have warned
    q, k, v = _qkv()
    with caplog.at_level(logging.WARNING, logger="optwin.ingest.capture"), capture() as rec:
        F.scaled_dot_product_attention(q, k, v, scale=1.0)
        F.scaled_dot_product_attention(q, k, v, None, 0.0, False, scale=2.0)
    assert _attention(rec) == []
    assert sum(n for why, n in rec.skipped.items() if "scale" in why) == 2
    assert len([r for r in caplog.records if "scale" in r.getMessage()]) == 1


@pytest.mark.parametrize("scale", [None, 1 / math.sqrt(64), 64 ** -0.5])
def test_sdpa_with_the_default_scale_is_recorded(scale):
    q, k, v = _qkv()
    with capture() as rec:
        F.scaled_dot_product_attention(q, k, v, scale=scale)
    assert len(_attention(rec)) == 1 and not rec.skipped


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_hf_attention_with_a_model_scaling_is_skipped(impl):
    model = load_llama_tiny(impl).module
    ids = torch.randint(1, 999, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), capture(model) as rec:
        model(input_ids=ids)
    assert len(_attention(rec)) == 2  # the config's head_dim ** -0.5: recorded
    for layer in model.model.layers:
        layer.self_attn.scaling = 1.0  # a model with its own softmax scale (Gemma's query_pre_attn_scalar)
    with torch.no_grad(), capture(model) as rec:
        model(input_ids=ids)
    assert _attention(rec) == []
    assert sum(n for why, n in rec.skipped.items() if "scale" in why) == 2
