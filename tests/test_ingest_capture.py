"""Capture hooks on real models (all-MiniLM-L6-v2 weights, a random-weight Llama) and plain modules.

    python -m pytest -q tests/test_ingest_capture.py
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from optwin.ingest import sketch
from optwin.ingest.capture import capture, classify_module
from optwin.ingest.models import default_texts, load_model


def _out(o):  # noqa: ANN001, ANN202
    return o.logits if hasattr(o, "logits") and o.logits is not None else o.last_hidden_state


@pytest.fixture(scope="module")
def texts() -> list[str]:
    t = default_texts(16)
    assert len(t) == 16 and all(len(s.split()) >= 6 for s in t)
    return t


def _run(spec: str, texts: list[str], **kw):  # noqa: ANN202
    lm = load_model(spec)
    batch = next(lm.batches(texts, 8))
    with torch.no_grad():
        ref = _out(lm.module(**batch))
        with capture(lm.module, **kw) as rec:
            got = _out(lm.module(**batch))
        after = _out(lm.module(**batch))
    return lm, batch, ref, got, after, rec


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_llama_ops_variants_streams(texts: list[str], attn: str) -> None:
    spec = "llama-tiny" if attn == "sdpa" else "llama-tiny-eager"
    lm, batch, ref, got, after, rec = _run(spec, texts, sample_rate=1.0, capacity=2)
    assert torch.equal(ref, got) and torch.equal(ref, after)  # capture never changes outputs
    recs = rec.records()
    count = Counter((r["op"], r["variant"]) for r in recs)
    att = "sdpa" if attn == "sdpa" else "math"
    # 2 layers: q,k,v,o,gate,up,down per layer + lm_head; 2 norms per layer + final norm; rope on q and k.
    assert count == {("matmul", "torch"): 15, ("rmsnorm", "fp32-acc"): 5, ("rope", "fp32-angles"): 4, ("attention", att): 2}
    streams = {(r["op"], r["stream"]) for r in recs}
    for i in range(2):
        assert ("attention", f"model.layers.{i}.self_attn") in streams
        assert ("rope", f"model.layers.{i}.self_attn:q") in streams and ("rope", f"model.layers.{i}.self_attn:k") in streams
        assert ("rmsnorm", f"model.layers.{i}.input_layernorm") in streams
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            assert ("matmul", f"model.layers.{i}.self_attn.{proj}") in streams
    assert ("rmsnorm", "model.norm") in streams and ("matmul", "lm_head") in streams
    seq = batch["input_ids"].shape[1]
    for r in recs:
        if r["op"] == "attention":
            assert r["params"] == {"causal": True} and r["sketch"]["seq_k"] == seq and r["sketch"]["d"] == 16
        if r["op"] == "rope":
            assert r["sketch"]["max_pos"] == seq - 1 and r["sketch"]["base"] == 10000.0 and r["sketch"]["heads"] == 4
        if r["op"] == "matmul" and r["stream"].endswith("q_proj"):
            assert (r["sketch"]["m"], r["sketch"]["k"], r["sketch"]["n"]) == (8 * seq, 64, 64)
    assert [r["call_index"] for r in recs] == list(range(len(recs)))
    assert all(b["t"] >= a["t"] for a, b in zip(recs, recs[1:]))
    assert not rec.skipped


def test_minilm_ops_variants_streams(texts: list[str]) -> None:
    lm, batch, ref, got, after, rec = _run("minilm", texts, sample_rate=0.5, capacity=2, seed=3)
    assert torch.equal(ref, got) and torch.equal(ref, after)
    recs = rec.records()
    count = Counter((r["op"], r["variant"]) for r in recs)
    # BERT, 6 layers: q,k,v,attn-out,intermediate,output dense per layer + pooler; LayerNorm after
    # embeddings and twice per layer; sdpa (HF default attn_implementation) once per layer and run of batch rows
    # with one live length: the batch is padded, and each such run is recorded over its live tokens only (the
    # whole batch as one record over every key replayed the padded rows seeing pad keys: it was 6 records;
    # tests/test_capture_s49_encoder_padding.py)
    lengths = batch["attention_mask"].sum(1).tolist()
    runs = 1 + sum(a != b for a, b in zip(lengths, lengths[1:]))
    assert runs > 1 and count == {("matmul", "torch"): 37, ("layernorm", "torch"): 13, ("attention", "sdpa"): 6 * runs}
    streams = {(r["op"], r["stream"]) for r in recs}
    assert ("layernorm", "embeddings.LayerNorm") in streams
    for i in range(6):
        assert ("attention", f"encoder.layer.{i}.attention.self") in streams
        assert ("layernorm", f"encoder.layer.{i}.output.LayerNorm") in streams
        assert ("matmul", f"encoder.layer.{i}.intermediate.dense") in streams
    for r in recs:
        if r["op"] == "attention":
            assert r["params"] == {"causal": False} and r["sketch"]["heads"] == 12 and r["sketch"]["d"] == 32
            assert r["sketch"]["seq_q"] == r["sketch"]["seq_k"] in lengths
        if r["op"] == "layernorm":
            assert r["sketch"]["hidden"] == 384 and r["dtype"] == "float32"
    # Reservoir: at most `capacity` per (op, variant, dtype, shape class), some kept at rate 0.5,
    # and a kept sample's sketch equals the recorded sketch of its call.
    assert all(len(box) <= 2 for box in rec.samples.values())
    kept = rec.all_samples()
    assert kept
    for s in kept:
        r = recs[s.call_index]
        assert (r["op"], r["stream"]) == (s.op, s.stream)
        assert sketch(s.op, s.inputs, s.params) == pytest.approx(r["sketch"], rel=1e-6)


class NativeRMSNorm(nn.Module):
    """T5LayerNorm-style norm without the fp32 upcast: its numerics are rmsnorm native-dtype."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = (x * x).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(v + 1e-6))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = NativeRMSNorm(16)
        self.proj = nn.Linear(16, 8)
        self.w = nn.Parameter(torch.randn(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.norm(x))  # (2, 5, 8)
        s = F.softmax(h, dim=1) + torch.softmax(h, -1) + h.softmax(-1)
        y = s @ self.w  # (2, 5, 4): a [..., k] @ b [k, n]
        z = torch.mm(y[0], y[0].T)  # (5, 5)
        _ = y @ y.transpose(1, 2)  # batched @ batched: not a catalog matmul
        ln = F.layer_norm(z, (5,))  # no weight/bias
        rn = F.rms_norm(z, (5,))
        return ln + rn


def test_torch_functions_and_module_variants() -> None:
    torch.manual_seed(0)
    m = Block()
    x = torch.randn(2, 5, 16)
    ref = m(x)
    with capture(m) as rec:
        got = m(x)
    assert torch.equal(ref, got)
    recs = rec.records()
    got_calls = [(r["op"], r["variant"], r["stream"]) for r in recs]
    assert got_calls == [
        ("rmsnorm", "native-dtype", "norm"),
        ("matmul", "torch", "proj"),
        ("softmax", "torch", ""), ("softmax", "torch", ""), ("softmax", "torch", ""),
        ("matmul", "torch", ""), ("matmul", "torch", ""),
        ("layernorm", "torch", ""), ("rmsnorm", "fp32-acc", ""),
    ]
    assert recs[2]["sketch"]["n"] == 5 and recs[2]["sketch"]["rows"] == 16  # dim=1 moved last: (2, 8) rows of 5
    assert recs[5]["sketch"]["m"] == 10 and recs[5]["sketch"]["k"] == 8 and recs[5]["sketch"]["n"] == 4
    assert recs[1]["sketch"]["out_bound"] == pytest.approx(
        (m.norm(x).reshape(-1, 16).double().norm(dim=1).max() * m.proj.weight.double().norm(dim=1).max()).item(), rel=1e-6)
    assert classify_module(NativeRMSNorm(4)) == ("rmsnorm", "native-dtype")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    assert classify_module(LlamaRMSNorm(4)) == ("rmsnorm", "fp32-acc")


def test_capture_restores_everything_and_filters_ops() -> None:
    import transformers.models.llama.modeling_llama as ml

    orig = ml.apply_rotary_pos_emb, ml.eager_attention_forward
    m = Block()
    x = torch.randn(2, 5, 16)
    with capture(m, ops=["softmax"]) as rec:
        m(x)
        assert ml.apply_rotary_pos_emb is not orig[0]
    assert (ml.apply_rotary_pos_emb, ml.eager_attention_forward) == orig
    assert not m._forward_hooks and not m.norm._forward_pre_hooks
    assert {r["op"] for r in rec.records()} == {"softmax"}
    with capture(None) as rec2:
        F.softmax(torch.randn(3, 4), -1)
    assert [r["stream"] for r in rec2.records()] == [""]
    with pytest.raises(ValueError):
        with capture(m, sample_rate=2.0):
            pass


def test_interception_is_per_thread_nests_and_unwinds() -> None:
    """The wrapped torch functions (optwin.ingest.intercept): originals back after the last capture
    leaves; a call in another thread is not recorded; nested captures both record a call; a wrapped
    function calling another (F.layer_norm -> torch.layer_norm) is recorded once."""
    import threading

    from optwin.ingest import intercept
    from optwin.ingest.capture import TARGETS

    originals = [getattr(t.owner, t.name) for t in TARGETS]
    x = torch.randn(3, 8)
    with capture(None) as outer:
        assert all(intercept.original(getattr(t.owner, t.name)) is o for t, o in zip(TARGETS, originals))
        other = threading.Thread(target=lambda: F.softmax(x, -1))
        other.start()
        other.join()
        with capture(None) as inner:
            F.layer_norm(x, (8,))
            x.softmax(-1)
        x @ x.T
    assert [getattr(t.owner, t.name) for t in TARGETS] == originals
    assert [r["op"] for r in inner.records()] == ["layernorm", "softmax"]
    assert [r["op"] for r in outer.records()] == ["layernorm", "softmax", "matmul"]
    F.softmax(x, -1)  # after the block: nothing records, nothing raises
    assert len(outer.records()) == 3


def test_gqa_attention_inputs_made_only_for_recorded_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grouped-query Llama (eager attention): the attention record has k and v repeated to q's heads,
    and a capture that does not record attention never makes them (no repeat of k and v per call)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 97, (2, 12))
    repeats = Counter()
    orig = torch.Tensor.repeat_interleave

    def counted(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        repeats["n"] += 1
        return orig(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "repeat_interleave", counted)
    with torch.no_grad():
        with capture(model, ops=("rmsnorm", "rope")) as rec:
            model(ids)
        assert repeats["n"] == 0 and {r["op"] for r in rec.records()} == {"rmsnorm", "rope"}
        with capture(model, ops=("attention",)) as rec:
            model(ids)
    att = rec.records()
    assert len(att) == 2 and repeats["n"] == 4  # k and v of each layer, for its record only
    assert all(r["sketch"]["heads"] == 4 and r["sketch"]["seq_k"] == 12 for r in att)
