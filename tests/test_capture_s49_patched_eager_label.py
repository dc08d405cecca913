"""A capture (or a "raise"/"fallback" monitor) of an eager-attention model patched before it: softmax/triton records.

    python -m pytest -q tests/test_capture_s49_patched_eager_label.py

optwin.kernels.patch swaps transformers' eager_attention_forward for one that runs QK^T * scale (+ mask), our Triton
softmax, then @ V. A capture started afterwards wrapped that function and recorded each call as attention "math",
whose twin replays torch's softmax: numerics that never ran. The call is now one softmax "triton" record whose input
(kept by the capture's reservoir) is the scores tensor the patched function handed its kernel, as a "warn" monitor
already records it from the kernel's fused sketch. Calls the patch leaves to the model's code (float64, gradients,
an undone patch) and unpatched models stay attention "math". Tiny random-weight transformers Llamas (2 layers, 4
heads) run the kernels under TRITON_INTERPRET=1.
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
from optwin.ingest.capture import capture  # noqa: E402
from optwin.ingest.models import load_llama_tiny  # noqa: E402
from optwin.twin import softmax as softmax_twin  # noqa: E402

SEQ = 6
IDS = torch.randint(0, 1000, (1, SEQ), generator=torch.Generator().manual_seed(5))  # (batch, seq)
LAYERS, HEADS = 2, 4  # load_llama_tiny's


def _attention_records(rows: list[dict]) -> Counter:
    """(stream, op, variant, dtype) -> count, for the attention and softmax records."""
    return Counter((r["stream"], r["op"], r["variant"], r["dtype"]) for r in rows
                   if r["op"] in ("attention", "softmax"))


def _per_layer(op: str, variant: str, dtype: str) -> Counter:
    return Counter({(f"model.layers.{i}.self_attn", op, variant, dtype): 1 for i in range(LAYERS)})


def test_patched_eager_attention_under_capture_is_softmax_triton_on_the_kernels_scores():
    model = load_llama_tiny("eager").module
    with torch.no_grad(), optwin.kernels.patch(model) as handle, \
            capture(model, sample_rate=1.0, capacity=8, ops=("attention", "softmax")) as rec:
        out = model(IDS, output_attentions=True)
    assert handle.calls["softmax"] == LAYERS  # our softmax ran every layer's call
    # before the fix: one attention/math record a layer, and no softmax record
    assert _attention_records(rec.records()) == _per_layer("softmax", "triton", "float32")
    kept = {s.stream: s for s in rec.all_samples()}
    for i in range(LAYERS):
        s = kept[f"model.layers.{i}.self_attn"]
        x = s.inputs["x"]
        assert (s.op, s.variant) == ("softmax", "triton")
        assert x.shape == (1, HEADS, SEQ, SEQ) and x.dtype == torch.float32
        # the kept x is what the kernel received: the softmax twin's float64 reference of it gives the weights the
        # model returned (the kernel's fp32 output; the causal mask is in x, so its zeros are too)
        got = softmax_twin.reference({"x": x.double()}, {}).float()
        torch.testing.assert_close(got, out.attentions[i], rtol=0, atol=2e-6)


@pytest.mark.parametrize("policy", ["raise", "fallback"])
def test_patched_eager_attention_under_a_policy_acting_before_the_call_is_softmax_triton(db, policy):
    model = load_llama_tiny("eager").module
    seen: Counter = Counter()
    with torch.no_grad(), ExitStack() as stack:
        handle = stack.enter_context(optwin.kernels.patch(model))
        mon = stack.enter_context(om.monitor(model, db=db, policy=policy, sampling="always",
                                             ops=("attention", "softmax")))
        real = mon._sampled

        def counting(op, variant, dt, site):  # every record reaches it once
            seen[(site, op, variant, dt)] += 1
            return real(op, variant, dt, site)

        mon._sampled = counting
        model(IDS)
    assert handle.calls["softmax"] == LAYERS and not handle.sketched  # checked before the kernel, from the scores
    assert seen == _per_layer("softmax", "triton", "float32")  # before the fix: attention/math
    assert mon.stats.checked == LAYERS and mon.stats.skipped == 0


@pytest.mark.parametrize("case", ["unpatched", "float64", "gradients", "undone"])
def test_eager_attention_the_kernel_does_not_run_stays_attention_math(case):
    model = load_llama_tiny("eager", dtype=torch.float64 if case == "float64" else torch.float32).module
    with ExitStack() as stack:
        if case != "gradients":  # with gradients, the patched function leaves the call to the model's code
            stack.enter_context(torch.no_grad())
        handle = None if case == "unpatched" else stack.enter_context(optwin.kernels.patch(model))
        rec = stack.enter_context(capture(model, ops=("attention", "softmax")))
        if case == "undone":
            handle.undo()  # under the capture: its wrapper stays, and calls the model's code
        model(IDS)
    assert handle is None or handle.calls["softmax"] == 0
    dtype = "float64" if case == "float64" else "float32"
    assert _attention_records(rec.records()) == _per_layer("attention", "math", dtype)
