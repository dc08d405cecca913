"""nn.MultiheadAttention / nn.TransformerEncoder in eval without autograd: the capture records what train
mode records, and a monitor counts torch's fast-path calls as skipped.

    python -m pytest -q tests/test_ingest_capture_mha_fastpath.py

In eval under no_grad or inference_mode (how `optwin capture` runs models) torch runs these modules
through torch._native_multi_head_attention / torch._transformer_encoder_layer_fwd, fused C++ that calls
none of the wrapped functions: a 2-layer encoder recorded 4 of its 8 matmuls and no attention, a bare
MultiheadAttention nothing, and nothing was counted in `skipped`.
"""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext

import pytest
import torch
from torch import nn

import optwin.monitor as om
from optwin.ingest.capture import capture

GRAD_OFF = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


def _encoder() -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


def _x() -> torch.Tensor:
    return torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(1))  # (batch, seq, d_model)


def _count(model: nn.Module, run, ctx) -> tuple[Counter, Counter, torch.Tensor]:  # noqa: ANN001
    with ctx(), capture(model) as rec:
        out = run()
    return Counter((r["op"], r["variant"]) for r in rec.records()), rec.skipped, out


@pytest.mark.parametrize("grad_off", list(GRAD_OFF))
def test_encoder_in_eval_records_what_train_mode_records(grad_off: str) -> None:
    enc, x = _encoder(), _x()
    enc.train()
    train, _, _ = _count(enc, lambda: enc(x), nullcontext)
    assert train == {("matmul", "torch"): 8, ("attention", "sdpa"): 2, ("layernorm", "torch"): 4}
    enc.eval()
    before = torch.backends.mha.get_fastpath_enabled()
    with torch.no_grad():
        ref = enc(x)  # the fast path, outside a capture
    got, skipped, out = _count(enc, lambda: enc(x), GRAD_OFF[grad_off])
    assert got == train and not skipped, (got, skipped)
    assert torch.allclose(out, ref, atol=1e-5)  # the slow path computes the same layer
    assert torch.backends.mha.get_fastpath_enabled() is before  # put back after the capture


@pytest.mark.parametrize("grad_off", list(GRAD_OFF))
def test_bare_encoder_layer_in_eval(grad_off: str) -> None:
    # called on its own (not from nn.TransformerEncoder), the layer runs torch._transformer_encoder_layer_fwd
    layer, x = _encoder().layers[0], _x()
    train, _, _ = _count(layer, lambda: layer(x), nullcontext)
    assert train == {("matmul", "torch"): 4, ("attention", "sdpa"): 1, ("layernorm", "torch"): 2}
    layer.eval()
    got, skipped, _ = _count(layer, lambda: layer(x), GRAD_OFF[grad_off])
    assert got == train and not skipped, (got, skipped)


@pytest.mark.parametrize("grad_off", list(GRAD_OFF))
@pytest.mark.parametrize("need_weights", [False, True])
def test_bare_multihead_attention_in_eval(grad_off: str, need_weights: bool) -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(64, 4, batch_first=True)
    x = _x()
    train, _, _ = _count(mha, lambda: mha(x, x, x, need_weights=need_weights), nullcontext)
    # in_proj and out_proj; the scores go through sdpa, or with need_weights through bmm + softmax
    assert train == {("matmul", "torch"): 2, ("attention", "sdpa") if not need_weights else ("softmax", "torch"): 1}
    mha.eval()
    got, skipped, _ = _count(mha, lambda: mha(x, x, x, need_weights=need_weights), GRAD_OFF[grad_off])
    assert got == train and not skipped, (got, skipped)


def test_nested_captures_restore_the_fast_path_switch_in_any_order() -> None:
    mha = torch.backends.mha
    before = mha.get_fastpath_enabled()
    outer, inner = capture(), capture()
    running = []  # entered and not yet stopped: a failed assert stops them below
    try:
        outer.__enter__()
        running.append(outer)
        inner.__enter__()
        running.append(inner)
        assert mha.get_fastpath_enabled() is False
        running.remove(outer)
        outer.__exit__(None, None, None)  # the outer one stops first: the inner one still needs it off
        assert mha.get_fastpath_enabled() is False
        running.remove(inner)
        inner.__exit__(None, None, None)
        assert mha.get_fastpath_enabled() is before
    finally:
        # the switch is process-wide: left off (or a capture's wrappers left in place), it would change
        # every later test in this process
        for c in reversed(running):
            c.__exit__(None, None, None)
        mha.set_fastpath_enabled(before)


@pytest.mark.parametrize("grad_off", list(GRAD_OFF))
def test_monitor_counts_fast_path_calls_as_skipped(db: str, grad_off: str) -> None:
    enc, x = _encoder(), _x()
    enc.eval()
    mha = nn.MultiheadAttention(64, 4, batch_first=True).eval()
    with torch.no_grad():
        ref = enc(x), mha(x, x, x)[0]
    with GRAD_OFF[grad_off](), om.monitor(enc, db=db, sampling="always") as mon:
        out = enc(x), mha(x, x, x)[0]
    assert torch.get_default_dtype() == torch.float32 and torch.backends.mha.get_fastpath_enabled()
    assert all(torch.equal(a, b) for a, b in zip(ref, out))  # the fast path ran, results unchanged
    skipped = mon._rec.skipped
    reasons = {k: n for k, n in skipped.items() if "fast path" in k}
    # the encoder's 2 layers run _transformer_encoder_layer_fwd or, per layer, _native_multi_head_attention
    # (torch picks by its own checks); the bare MultiheadAttention runs _native_multi_head_attention
    assert sum(n for k, n in reasons.items() if k.startswith("attention: inside torch.")) == 3, dict(skipped)
    assert any(k.startswith("matmul: inside torch._native_multi_head_attention") for k in reasons), dict(skipped)
    assert mon.stats.skipped >= sum(reasons.values()) > 0


def test_monitor_counts_the_encoder_layer_fast_path_by_watched_op(db: str) -> None:
    # model=None: the module hooks a monitor puts on nn.LayerNorm turn this path off (torch checks for hooks)
    layer, x = _encoder().layers[0].eval(), _x()
    with torch.inference_mode(), om.monitor(None, db=db, sampling="always", ops=("layernorm",)) as mon:
        layer(x)
    why = "inside torch._transformer_encoder_layer_fwd (torch's MHA fast path; a capture turns it off, a monitor does not)"
    assert dict(mon._rec.skipped) == {f"layernorm: {why}": 2}  # norm1, norm2; the ops not watched are not counted
    assert mon.stats.skipped == 2 and mon.stats.calls == 0
