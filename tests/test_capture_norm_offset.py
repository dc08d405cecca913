"""Gemma-style RMSNorms (x * (1 + w)) are recorded with their effective weight 1 + w.

    python -m pytest -q tests/test_capture_norm_offset.py

Gemma3RMSNorm keeps w (zeros at init) and multiplies by (1.0 + w.float()): the capture recorded w as
the weight (weight_absmax 0.0 where the norm scales by 1.0), so the sketch described another norm.
"""

from __future__ import annotations

import torch

from optwin.ingest.capture import capture

# transformers' modeling modules import triton: imported inside the tests, so a later test module can still
# set TRITON_INTERPRET=1 before triton's import (tests/_kernel_checks.py)


def _tf():  # noqa: ANN202
    import transformers
    return transformers


def _norm_records(m: torch.nn.Module) -> tuple[list[dict], list]:
    with torch.no_grad(), capture(m, sample_rate=1.0, capacity=100) as rec:
        m(input_ids=torch.randint(1, 100, (1, 10), generator=torch.Generator().manual_seed(1)))
    return ([r for r in rec.records() if r["op"] == "rmsnorm"],
            [s for s in rec.all_samples() if s.op == "rmsnorm"])


def test_gemma_norm_records_one_plus_w_in_float32() -> None:
    torch.manual_seed(0)
    cfg = _tf().Gemma3TextConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                           layer_types=["full_attention"], attn_implementation="eager")
    m = _tf().Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for mod in m.modules():
            if type(mod).__name__ == "Gemma3RMSNorm":
                mod.weight.uniform_(-3.0, 1.0)  # |w| up to 3, |1 + w| up to 2
    records, samples = _norm_records(m)
    norms = {s.stream: mod for s in samples for n, mod in m.named_modules() if n == s.stream}
    assert records and len(norms) == len(records)
    for r in records:
        w = norms[r["stream"]].weight.detach()
        assert r["sketch"]["weight_absmax"] == float((1.0 + w.float()).abs().max())
    for s in samples:
        w = norms[s.stream].weight
        assert s.inputs["weight"].dtype == torch.float32
        assert torch.equal(s.inputs["weight"], 1.0 + w.float())


def test_llama_norm_records_its_weight_as_is() -> None:
    torch.manual_seed(0)
    cfg = _tf().LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    m = _tf().LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.model.norm.weight.uniform_(-3.0, 1.0)
    _, samples = _norm_records(m)
    final = [s for s in samples if s.stream == "model.norm"]
    assert final and torch.equal(final[0].inputs["weight"], m.model.norm.weight)
