"""A monitor on an eager-attention model patched before it started: one record per attention call.

    python -m pytest -q tests/test_monitor_s49_patched_eager.py

optwin.kernels.patch swaps transformers' eager_attention_forward for one that runs our Triton softmax between
QK^T * scale (+ mask) and @ V; a monitor started afterwards wrapped that function and recorded each call as
attention "math" (whose twin runs torch's softmax), while the softmax inside handed the monitor its fused sketch
as softmax "triton": every attention call was two records. The softmax record is the one that describes what
runs, and the one a patch applied under the monitor leaves (it replaces the monitor's wrapper). Tiny
random-weight transformers Llamas (2 layers) run the kernels under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os
from collections import Counter
from contextlib import ExitStack

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

import optwin.kernels  # noqa: E402
import optwin.monitor as om  # noqa: E402
from optwin.ingest.models import load_llama_tiny  # noqa: E402

IDS = torch.randint(0, 1000, (1, 6), generator=torch.Generator().manual_seed(5))  # (batch, seq)
FORWARDS = 2
LAYERS = 2  # load_llama_tiny's


def _records(model: torch.nn.Module, db: str, order: str) -> tuple[Counter, om.Monitor, Counter]:
    """Per (site, op, variant): how many attention/softmax calls the monitor was handed over FORWARDS forwards,
    with the patch entered before the monitor ("patch-first"), after it ("monitor-first"), or not at all."""
    seen: Counter = Counter()
    with torch.no_grad(), ExitStack() as stack:
        handle = stack.enter_context(optwin.kernels.patch(model)) if order == "patch-first" else None
        mon = stack.enter_context(om.monitor(model, db=db, sampling="always", ops=("attention", "softmax")))
        if order == "monitor-first":
            handle = stack.enter_context(optwin.kernels.patch(model))
        real = mon._sampled

        def counting(op, variant, dt, site):  # every record and every fused-sketch request reaches it once
            seen[(site, op, variant)] += 1
            return real(op, variant, dt, site)

        mon._sampled = counting
        for _ in range(FORWARDS):
            model(IDS)
    return seen, mon, Counter() if handle is None else handle.sketched


def _per_layer(op: str, variant: str) -> Counter:
    return Counter({(f"model.layers.{i}.self_attn", op, variant): FORWARDS for i in range(LAYERS)})


@pytest.mark.parametrize("order", ["patch-first", "monitor-first"])
def test_patched_eager_attention_is_one_softmax_triton_record_per_call(db, order):
    model = load_llama_tiny("eager").module
    seen, mon, sketched = _records(model, db, order)
    # before the fix, patch-first also gave each layer FORWARDS attention/math records
    assert seen == _per_layer("softmax", "triton")
    assert sketched == {"softmax": LAYERS * FORWARDS}  # each one the kernel's own fused sketch
    assert mon.stats.checked == LAYERS * FORWARDS and mon.stats.skipped == 0


@pytest.mark.parametrize(("impl", "order", "variant"), [
    ("eager", "unpatched", "math"),  # the model's own eager attention: still recorded, once
    ("sdpa", "patch-first", "sdpa"),  # the patch leaves sdpa alone: its record stays
])
def test_attention_the_patch_does_not_run_keeps_its_record(db, impl, order, variant):
    model = load_llama_tiny(impl).module
    seen, mon, sketched = _records(model, db, order)
    assert seen == _per_layer("attention", variant)
    assert not sketched and mon.stats.checked == LAYERS * FORWARDS
