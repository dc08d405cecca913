"""A patched model's fused rope sketch is assessed only where capture would record the call: a scaled rope_type
(llama3, linear, ...) is skipped with capture's reason under the patch too.

    python -m pytest -q tests/test_monitor_fused_rope_verdict.py

The monitor's fused path took the rotary module's base (or 10000) and assessed every patched rope call as the
catalog's fp32-angles rope, while the unpatched path skips scaled ropes: their cos/sin are not the catalog's.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

import optwin.kernels  # noqa: E402
import optwin.monitor as om  # noqa: E402


def _llama(rope: dict) -> torch.nn.Module:
    import transformers  # imports triton: after TRITON_INTERPRET is set

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                                   rope_parameters=rope, attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("rope,skipped", [
    ({"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0}, "rope: scaled rope_type linear is not a catalog variant"),
    ({"rope_type": "default", "rope_theta": 500000.0}, None),
])
def test_patched_rope_is_assessed_only_as_capture_would_record_it(db, rope, skipped) -> None:
    model = _llama(rope)
    ids = torch.randint(1, 100, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), optwin.kernels.patch(model) as h, \
            om.monitor(model, db=db, sampling="always", ops=("rope",)) as mon:
        model(ids)
    assert h.calls.get("rope") == 2  # q and k; the kernel ran either way: y comes from the model's own tables
    ropes = [k for k in mon.last_sketches if k[1] == "rope"]
    if skipped:
        assert ropes == [] and mon.stats.skipped >= 1
    else:
        assert len(ropes) == 2 and mon.last_sketches[ropes[0]]["base"] == 500000.0 and mon.stats.skipped == 0
