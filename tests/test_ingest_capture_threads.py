"""Capture under threads, torch.compile, autocast and nesting (random-weight tiny Llama, small modules).

    python -m pytest -q tests/test_ingest_capture_threads.py
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from optwin.ingest.capture import BOTTOM_RIGHT_SKIP, capture
from optwin.ingest.models import load_llama_tiny

# One forward of the 2-layer tiny Llama: q,k,v,o,gate,up,down per layer + lm_head; 2 norms per layer +
# the final norm; rope on q and k per layer; one attention per layer.
PER_FORWARD = {"matmul": 15, "rmsnorm": 5, "rope": 4, "attention": 2}


def _ops(rec) -> Counter:  # noqa: ANN001
    return Counter(r["op"] for r in rec.records())


@pytest.fixture(scope="module")
def llama() -> nn.Module:
    return load_llama_tiny("eager").module


def _parking() -> tuple[threading.Event, threading.Event, object]:
    """A forward pre-hook that parks every thread but this one inside the module (`inside` set) until `go`."""
    inside, go = threading.Event(), threading.Event()
    main = threading.get_ident()

    def park(m: nn.Module, args: tuple) -> None:
        if threading.get_ident() != main:
            inside.set()
            assert go.wait(30)

    return inside, go, park


def test_another_thread_inside_the_model_neither_blinds_nor_feeds_the_capture(llama: nn.Module) -> None:
    """A second thread parked inside the hooked final norm (its pre-hook has run) while the capturing
    thread runs two forwards: every call of the capturing thread is recorded, none of the other's. The
    recorder's suppress count and module stack were shared: the parked thread held suppress at 1 and the
    capturing thread recorded nothing."""
    ids = torch.randint(1, 999, (2, 9))
    inside, go, park = _parking()

    def other() -> None:
        with torch.no_grad():
            llama(input_ids=ids)

    with torch.no_grad(), capture(llama) as rec:
        h = llama.model.norm.register_forward_pre_hook(park)  # after the capture's: it runs second
        t = threading.Thread(target=other)
        t.start()
        try:
            assert inside.wait(30)
            for _ in range(2):
                llama(input_ids=ids)
            assert rec.suppress == 0 and not rec._stack
        finally:
            go.set()
            t.join()
            h.remove()
    assert _ops(rec) == {op: 2 * n for op, n in PER_FORWARD.items()}
    assert rec.suppress == 0 and not rec._stack and not rec.skipped


def test_a_capture_does_not_record_another_threads_model() -> None:
    """Thread B runs its own model (eager attention and rope go through the wrapped transformers
    functions, global to the process) while thread A captures model A and runs nothing: nothing is
    recorded (B's attention calls were, with stream "")."""
    a, b = load_llama_tiny("eager").module, load_llama_tiny("eager", seed=1).module
    ids = torch.randint(1, 999, (2, 9))

    def other() -> None:
        with torch.no_grad():
            b(input_ids=ids)

    with capture(a) as rec:
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert rec.records() == [] and not rec.skipped


def test_nested_captures_both_record_rope_and_attention(llama: nn.Module) -> None:
    """The wrapped transformers functions feed every capture active in the thread. A wrapper per
    capture fed only the first: the inner one recorded no rope or attention, and the eager attention's
    softmax as a softmax call."""
    ids = torch.randint(1, 999, (2, 9))
    with torch.no_grad(), capture(llama) as outer:
        llama(input_ids=ids)
        with capture(llama) as inner:
            llama(input_ids=ids)
        llama(input_ids=ids)
    assert _ops(inner) == PER_FORWARD
    assert _ops(outer) == {op: 3 * n for op, n in PER_FORWARD.items()}
    import transformers.models.llama.modeling_llama as ml

    assert not hasattr(ml.apply_rotary_pos_emb, "__optwin_capture__")
    assert not hasattr(ml.eager_attention_forward, "__optwin_capture__")


def test_compiled_model_records_the_real_tensors() -> None:
    """A torch.compile'd Llama (backend "eager": dynamo's tracing, no code generation), run once before
    the capture: the capture records every call with the sketch of the real tensors, equal to the
    uncompiled model's. Dynamo traced the hooks and wrappers (the capture's hooks make it recompile) and
    FakeTensors ended up in the records (the rotary hook's positions among them): records() raised
    DataDependentOutputException."""
    import torch._dynamo

    from transformers import LlamaConfig, LlamaForCausalLM

    torch._dynamo.reset()
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager")
    torch.manual_seed(0)
    llama = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(1, 97, (2, 9))
    with torch.no_grad(), capture(llama) as ref:
        want = llama(input_ids=ids).logits
    compiled = torch.compile(llama, backend="eager")
    with torch.no_grad():
        compiled(input_ids=ids)
        with capture(llama) as rec:
            got = compiled(input_ids=ids).logits
    torch._dynamo.reset()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)

    def strip(recs: list[dict]) -> list[tuple]:
        return [(r["op"], r["variant"], r["dtype"], r["stream"], r["params"],
                 {k: round(v, 4) for k, v in r["sketch"].items()}) for r in recs]

    assert strip(rec.records()) == strip(ref.records())
    assert _ops(rec) == {"matmul": 8, "rmsnorm": 3, "rope": 2, "attention": 1} and not rec.skipped


def test_dynamo_does_not_trace_into_the_capture() -> None:
    """A compiled function's intercepted calls are one graph break at the disabled dispatch, then run
    eagerly. Dynamo traced into the recorder and the sketch (a dozen breaks: Tensor.item(), builtins),
    compiling pieces of the capture's own code and holding FakeTensors where it stored state."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    w, x = torch.randn(16, 16), torch.randn(4, 16)

    def f(x: torch.Tensor) -> torch.Tensor:
        return F.softmax(F.layer_norm(x @ w, (16,)), -1)

    with capture(None) as ref:
        f(x)
    with capture(None) as rec:
        explained = torch._dynamo.explain(f)(x)
    torch._dynamo.reset()
    reasons = {b.reason.splitlines()[0] for b in explained.break_reasons}
    assert reasons == {"Skip calling `torch.compiler.disable()`d function"}
    assert [(r["op"], r["sketch"]) for r in rec.records()] == [(r["op"], r["sketch"]) for r in ref.records()]


def test_autocast_calls_carry_the_dtype_they_compute_in() -> None:
    """Under torch.autocast(float16) nn.Linear on float32 runs a float16 GEMM (here it overflows to inf)
    and is recorded as float16, sdpa under bfloat16 as bfloat16; softmax (not lowered by autocast)
    keeps float32. The sketch itself is computed outside autocast: the same as without it."""
    lin = nn.Linear(256, 8)
    with torch.no_grad():
        lin.weight.fill_(1.0)
    x = torch.full((4, 256), 300.0)  # every output 76800 + bias: past float16's 65504
    with torch.no_grad(), capture(lin) as plain:
        lin(x)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16), capture(lin) as rec:
        y = lin(x)
        F.softmax(x, -1)
    assert y.dtype == torch.float16 and not torch.isfinite(y).all()
    (mm, sm), (mm0,) = rec.records(), plain.records()
    assert (mm["op"], mm["dtype"], sm["op"], sm["dtype"]) == ("matmul", "float16", "softmax", "float32")
    assert mm0["dtype"] == "float32" and mm["sketch"] == mm0["sketch"] and mm["sketch"]["out_bound"] > 65504
    q = torch.randn(1, 2, 8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16), capture(None) as rec:
        F.scaled_dot_product_attention(q, q, q)
    assert [(r["op"], r["dtype"]) for r in rec.records()] == [("attention", "bfloat16")]


def test_sdpa_prefill_with_padding_is_causal_and_a_cached_step_is_not_top_left() -> None:
    """Llama-sdpa prefill: causal with no mask, an all-ones mask and a left-padded batch (HF passes the
    last as an explicit causal-plus-padding mask and is_causal=False; it was recorded as non-causal).
    The left-padded batch is causal per batch row over its live keys (test_capture_s49_padding): the
    unpadded row over its 7 tokens, the padded row over its last 4. It was one causal record over every
    key of both rows, whose replay let the padded row's queries see the 3 pad keys the model's never saw.
    A 3-token eager step on a 9-token KV cache has HF's bottom-right mask, which neither the sketch's
    top-left causal flag nor non-causal describes (recorded causal, row 0 saw one key where the model's
    saw ten; then non-causal, rows 0 and 1 saw keys they did not): it is skipped and counted."""
    sdpa = load_llama_tiny("sdpa").module
    ids = torch.randint(1, 999, (2, 7))
    left = torch.tensor([[1] * 7, [0] * 3 + [1] * 4])
    # per layer: (batch, seq_q, seq_k) of each record
    for kw, per_layer in (({}, [(2, 7, 7)]), ({"attention_mask": torch.ones_like(ids)}, [(2, 7, 7)]),
                          ({"attention_mask": left}, [(1, 7, 7), (1, 4, 4)])):
        with torch.no_grad(), capture(sdpa) as rec:
            sdpa(input_ids=ids, **kw)
        att = [r for r in rec.records() if r["op"] == "attention"]
        assert [tuple(int(r["sketch"][f]) for f in ("batch", "seq_q", "seq_k")) for r in att] == per_layer * 2, kw
        assert all(r["params"] == {"causal": True} and r["sketch"]["causal"] == 1.0 for r in att), kw
    eager = load_llama_tiny("eager").module
    ids = torch.randint(1, 999, (1, 12))
    with torch.no_grad():
        past = eager(input_ids=ids[:, :9], use_cache=True).past_key_values
        with capture(eager) as rec:
            out = eager(input_ids=ids[:, 9:], past_key_values=past, use_cache=True, output_attentions=True)
    att = [r for r in rec.records() if r["op"] == "attention"]
    assert att == [] and rec.skipped[BOTTOM_RIGHT_SKIP] == 2  # one per layer
    assert [int((out.attentions[0][0, 0, i] > 0).sum()) for i in range(3)] == [10, 11, 12]  # bottom-right


def test_a_monitor_sees_its_threads_calls_while_another_thread_runs_the_model(tmp_path) -> None:  # noqa: ANN001
    """The monitor records through the same hooks: another thread parked inside the hooked RMSNorm held
    the shared suppress count, and the monitor saw none of its own thread's calls ("0 calls seen",
    for good once a race left suppress at 1)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from _matcher_fixture import cached_db

    import optwin.monitor as om

    class NativeRMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(64, dtype=torch.float16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    model = nn.Sequential(NativeRMSNorm(), nn.Linear(64, 64).half())
    x = torch.randn(4, 64).half()
    inside, go, park = _parking()

    mon = om.Monitor(model, db=cached_db(str(tmp_path / "fp.duckdb")), sampling="always")
    with mon, torch.no_grad():
        h = model[0].register_forward_pre_hook(park)  # after the monitor's: the other thread holds its pre-hook
        t = threading.Thread(target=lambda: model(x))
        t.start()
        try:
            assert inside.wait(30)
            for _ in range(3):
                model(x)
        finally:
            go.set()
            t.join()
            h.remove()
        assert mon._rec.suppress == 0 and not mon._rec._stack
    assert mon.stats.calls == 3 * 2  # rmsnorm + matmul per forward, this thread's only


@pytest.mark.parametrize("first", ["outer", "inner"])
def test_captures_stopped_out_of_order_keep_recording_and_restore_the_originals(llama: nn.Module, first: str) -> None:
    """The shared transformers wrappers outlive whichever capture stops first and go when the last one
    does. Each user setting back what it found left the wrapper installed for good when the outer one
    stopped first, and the inner one then recorded no rope or attention (the eager softmax as a softmax)."""
    import transformers.models.llama.modeling_llama as ml

    originals = ml.apply_rotary_pos_emb, ml.eager_attention_forward
    ids = torch.randint(1, 999, (2, 9))
    cms = {"outer": capture(llama), "inner": capture(llama)}
    recs = {name: cm.__enter__() for name, cm in cms.items()}  # outer starts first
    second = "inner" if first == "outer" else "outer"
    cms[first].__exit__(None, None, None)
    with torch.no_grad():
        llama(input_ids=ids)
    cms[second].__exit__(None, None, None)
    assert _ops(recs[second]) == PER_FORWARD
    assert _ops(recs[first]) == {}
    assert ml.apply_rotary_pos_emb is originals[0] and ml.eager_attention_forward is originals[1]


def test_a_replacement_made_during_a_capture_outlives_it(llama: nn.Module) -> None:
    """What someone else installs over the capture's wrapper (a kernel patch, a monkeypatch) stays when the
    capture stops; the wrapper, should the replacement's undo put it back, only passes calls through and
    no longer passes for a capture's (optwin.kernels.patch would keep the HF code), and the next capture
    drops it: its stop leaves the original."""
    import transformers.models.llama.modeling_llama as ml

    from optwin.kernels.patching import _watched_before_the_call

    original = ml.apply_rotary_pos_emb
    ids = torch.randint(1, 999, (1, 5))
    try:
        with capture(llama):
            wrapper = ml.apply_rotary_pos_emb

            def mine(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                return wrapper(*args, **kwargs)

            ml.apply_rotary_pos_emb = mine
        assert ml.apply_rotary_pos_emb is mine
        ml.apply_rotary_pos_emb = wrapper  # the replacement's own undo
        assert not _watched_before_the_call(ml.apply_rotary_pos_emb)
        with torch.no_grad(), capture(llama) as rec:
            llama(input_ids=ids)
        assert _ops(rec) == PER_FORWARD
        assert ml.apply_rotary_pos_emb is original
    finally:
        ml.apply_rotary_pos_emb = original
