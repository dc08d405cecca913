"""A "fallback" monitor on an eager model patched before it: a softmax predicted to fault runs in float32, no kernel.

    python -m pytest -q tests/test_monitor_s49_patched_fallback.py

optwin.kernels.patch swaps transformers' eager_attention_forward for one that runs QK^T * scale (+ mask), our
Triton softmax, then @ V; a monitor started afterwards records each call as softmax/triton from the scores the
patched function hands over (optwin.ingest.capture.eager_scores) before the launch. Under policy="fallback" a
predicted fault counted a fallback and logged "running in float32", but nothing read the verdict: our kernel is no
torch function, so no interceptor reran it, and the Triton softmax ran as predicted. The patched function now
computes that softmax as the monitor's fallback computes a torch call: torch's float32 softmax of the scores (the
kernel's float32 output dtype), no launch. The matcher is made to predict a fault on every softmax/triton call
with MatcherConfig(unbuilt_prior=1.0), its documented strict setting: the fixture database never replayed that
triple. Tiny random-weight transformers Llamas (2 layers) run the kernels under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os
from contextlib import ExitStack

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

import optwin.kernels  # noqa: E402
import optwin.monitor as om  # noqa: E402
from optwin.kernels import patching  # noqa: E402
from optwin.fingerprints.matcher import Matcher, MatcherConfig  # noqa: E402
from optwin.ingest.models import load_llama_tiny  # noqa: E402

IDS = torch.randint(0, 1000, (1, 6), generator=torch.Generator().manual_seed(5))  # (batch, seq)
LAYERS = 2  # load_llama_tiny's


def _run(db: str, dtype: torch.dtype, strict: bool, scores: list | None = None):
    """(model output, patch handle, monitor) of one forward of a patched tiny eager Llama under a "fallback" monitor of
    its softmax; strict: the matcher predicts every softmax/triton call faults (a triple the fixture never built).
    scores: gets the scores each patched call handed eager_scores."""
    model = load_llama_tiny("eager", dtype=dtype).module
    matcher = Matcher.open(db, config=MatcherConfig(unbuilt_prior=1.0 if strict else 0.0))
    real = patching.eager_scores

    def spy(query, x):  # the real hand-over, its scores kept
        if scores is not None:
            scores.append(x.clone())
        return real(query, x)

    with torch.no_grad(), ExitStack() as stack:
        stack.callback(setattr, patching, "eager_scores", real)
        patching.eager_scores = spy  # the patched function looks it up in its module on each call
        handle = stack.enter_context(optwin.kernels.patch(model))
        mon = stack.enter_context(om.monitor(model, matcher=matcher, policy="fallback", sampling="always",
                                             ops=("softmax",)))
        out = model(IDS, output_attentions=True)
    return out, handle, mon


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_softmax_predicted_to_fault_runs_in_float32_not_in_the_kernel(db, dtype):
    scores: list = []
    out, handle, mon = _run(db, dtype, strict=True, scores=scores)
    assert mon.stats.checked == LAYERS and mon.stats.fallbacks == LAYERS
    assert handle.calls["softmax"] == 0  # before the fix: LAYERS, the kernel ran every call the log said fell back
    # the fallback's numerics: torch's softmax of the float32 scores, cast to the model's dtype as the patched
    # function casts the kernel's float32 output
    assert len(scores) == LAYERS
    for x, got in zip(scores, out.attentions, strict=True):
        assert x.dtype == dtype and got.dtype == dtype
        torch.testing.assert_close(got, torch.softmax(x.float(), dim=-1).to(dtype), rtol=0, atol=0)


def test_a_softmax_not_predicted_to_fault_still_runs_the_kernel(db):
    _, handle, mon = _run(db, torch.float32, strict=False)
    assert mon.stats.checked == LAYERS and mon.stats.fallbacks == 0
    assert handle.calls["softmax"] == LAYERS


def test_raise_stops_the_call_before_the_kernel(db):
    model = load_llama_tiny("eager").module
    matcher = Matcher.open(db, config=MatcherConfig(unbuilt_prior=1.0))
    with torch.no_grad(), optwin.kernels.patch(model) as handle, \
            om.monitor(model, matcher=matcher, policy="raise", sampling="always", ops=("softmax",)) as mon:
        with pytest.raises(om.FaultPredicted, match="softmax/triton/float32"):
            model(IDS)
    assert mon.stats.raised == 1 and handle.calls["softmax"] == 0
