"""A rotary module whose cos/sin are not cos/sin of positions x its inv_freq is skipped, not recorded.

    python -m pytest -q tests/test_capture_s48_rope_table.py

Capture judged a rotary module by its inv_freq buffer, its rope_type and HF's `attention_scaling`
attribute; it never looked at the cos/sin the module returned. A module that scales its tables under
another name (DeepSeek's yarn rotary multiplies cos/sin by its `_mscale`, remote-code copies of HF's
rotary rename attention_scaling) passed with the catalog's inv_freq and was recorded as the catalog's
fp32-angles rope: the twin replayed cos(pos * inv), the model used 0.5 of it.
"""

from __future__ import annotations

import pytest
import torch

from optwin.ingest.capture import capture
from optwin.ingest.models import load_llama_tiny
from optwin.twin.rope import reference


def _mscale(m: torch.nn.Module, s: float) -> None:
    """Swap the tiny Llama's rotary module for one that scales cos/sin by `s` after computing them, as a
    rotary class does that keeps its scale under its own name (attention_scaling stays 1.0)."""
    rot = m.model.rotary_emb
    base = type(rot)

    class MScaleRotaryEmbedding(base):
        def forward(self, x, position_ids):  # noqa: ANN001, ANN202
            cos, sin = super().forward(x, position_ids)
            return cos * s, sin * s

    rot.__class__ = MScaleRotaryEmbedding
    assert rot.attention_scaling == 1.0 and rot.rope_type == "default"


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 999, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cos_sin_scaled_after_computing_are_skipped(dtype: torch.dtype) -> None:
    m = load_llama_tiny("eager", dtype=dtype).module
    _mscale(m, 0.5)
    layers = m.config.num_hidden_layers
    with torch.no_grad(), capture(m) as rec:
        m(input_ids=_ids(9))
        m(input_ids=_ids(9, 1))  # the verdict is kept for the module: the second forward is skipped too
    assert [r for r in rec.records() if r["op"] == "rope"] == []
    reasons = {k: n for k, n in rec.skipped.items() if k.startswith("rope:")}
    assert reasons == {"rope: the rotary module's cos/sin are not cos/sin of positions x inv_freq "
                       "(scaled or built otherwise)": 2 * 2 * layers}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hf_llamas_own_tables_are_recorded_and_replay(dtype: torch.dtype) -> None:
    """The check passes HF's own tables (float32, and cast to bfloat16 as a bfloat16 model's are): rope is
    recorded, and the twin's reference of a kept case is what the model's apply_rotary_pos_emb computed."""
    from transformers.models.llama import modeling_llama as ml

    m = load_llama_tiny("eager", dtype=dtype).module
    seen: list[torch.Tensor] = []
    orig = ml.apply_rotary_pos_emb

    def spy(q, k, cos, sin, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        out = orig(q, k, cos, sin, *a, **kw)
        seen.append(out[0])
        return out

    ml.apply_rotary_pos_emb = spy  # under the capture's wrapper, which wraps what it finds
    try:
        with torch.no_grad(), capture(m, sample_rate=1.0, capacity=100) as rec:
            m(input_ids=_ids(9))
    finally:
        ml.apply_rotary_pos_emb = orig
    ropes = [r for r in rec.records() if r["op"] == "rope"]
    assert len(ropes) == 2 * m.config.num_hidden_layers and not [k for k in rec.skipped if k.startswith("rope:")]
    q0 = next(s for s in rec.all_samples() if s.op == "rope" and s.stream.endswith(":q"))
    want = seen[0].transpose(1, 2).reshape(q0.inputs["x"].shape).double()  # (b*s, h, d) as the case holds x
    got = reference({"x": q0.inputs["x"].double(), "positions": q0.inputs["positions"].double()}, q0.params)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
