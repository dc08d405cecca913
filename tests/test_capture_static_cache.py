"""Attention over a static KV cache is recorded over the keys its mask uses, causal in the prefill.

    python -m pytest -q tests/test_capture_static_cache.py

A static cache hands attention all of its max_cache_len slots, the unwritten ones masked. Eager
attention's prefill (12 queries, 14 slots) was recorded non-causal over 14 keys, because a causal flag
needed seq_q == seq_k, and every decode step (eager and sdpa) over the empty slots as well.
"""

from __future__ import annotations

import pytest
import torch

from optwin.ingest.capture import capture
from optwin.ingest.models import load_llama_tiny


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_static_cache_records_the_used_keys(impl: str) -> None:
    m = load_llama_tiny(impl).module
    ids = torch.randint(1, 999, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), capture(m, sample_rate=1.0, capacity=100) as rec:
        m.generate(input_ids=ids, max_new_tokens=3, do_sample=False, cache_implementation="static")
    att = [(r["sketch"]["seq_q"], r["sketch"]["seq_k"], r["params"]["causal"])
           for r in rec.records() if r["op"] == "attention"]
    layers = m.config.num_hidden_layers
    assert att == [(12, 12, True)] * layers + [(1, 13, False)] * layers + [(1, 14, False)] * layers
    # the kept keys are the written cache rows: none of the zero slots after them
    for s in rec.all_samples():
        if s.op == "attention":
            assert s.inputs["k"].shape[2] in (12, 13, 14) and bool((s.inputs["k"][0, 0].abs().sum(-1) > 0).all())
