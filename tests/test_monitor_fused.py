"""The monitor on a model patched with our kernels: it reads the kernels' fused sketch (issue #6).

    python -m pytest -q tests/test_monitor_fused.py

A tiny random-weight transformers Llama (eager attention) and an nn.LayerNorm net run our Triton
kernels under TRITON_INTERPRET=1. Under policy "warn" every sampled call launches with the sketch
and hands the buffer to the monitor, which computes no sketch of its own; "raise" sketches the
inputs before the call (it needs the verdict first) and still names the variant "triton". The last
test builds a real fingerprint database from the twin of softmax/triton on the model's own attention
scores and checks that a drift towards peaked attention warns, through the fused sketch.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
from torch import nn  # noqa: E402

import optwin.kernels  # noqa: E402
import optwin.monitor as om  # noqa: E402
from _kernel_checks import close  # noqa: E402
from _matcher_fixture import twin_case, write_db  # noqa: E402
from optwin.fingerprints.sampling import SamplingConfig  # noqa: E402
from optwin.ingest import sketch  # noqa: E402
from optwin.ingest.models import load_llama_tiny  # noqa: E402
from optwin.kernels import sketch_sink  # noqa: E402

SEQ = 9
IDS = torch.randint(0, 1000, (2, SEQ), generator=torch.Generator().manual_seed(1))  # (batch, seq)


def _llama() -> nn.Module:
    model = load_llama_tiny("eager").module
    with torch.no_grad():  # non-trivial norm weights: a dropped weight would show in the sketch
        for m in model.modules():
            if type(m).__name__ == "LlamaRMSNorm":
                m.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(3))
    return model


def test_warn_monitor_takes_every_sampled_call_from_the_kernels(db):
    model = _llama()
    norm_inputs: dict[str, torch.Tensor] = {}
    norms = {p: m for p, m in model.named_modules() if type(m).__name__ == "LlamaRMSNorm"}
    for p, m in norms.items():
        m.register_forward_pre_hook(lambda m, a, p=p: norm_inputs.__setitem__(p, a[0].detach().clone()))
    with torch.no_grad(), optwin.kernels.patch(model) as handle, om.monitor(model, db=db, sampling="always") as mon:
        assert sketch_sink.active() is mon._rec
        model(IDS)
    assert sketch_sink.active() is None  # the monitor left the hand-off with its stop
    # 2 layers: 2 norms each + the final norm; q and k rotated per layer; one softmax per layer
    assert handle.calls == handle.sketched == {"rmsnorm": 5, "rope": 4, "softmax": 2}
    assert mon.stats.skipped == 0
    keys = {k for k in mon.streams if k[1] in ("rmsnorm", "rope", "softmax")}  # also watched: matmul, attention
    assert ("model.layers.0.input_layernorm:rmsnorm", "rmsnorm", "triton", "float32") in keys
    assert ("model.layers.1.self_attn:softmax", "softmax", "triton", "float32") in keys
    assert ("model.layers.0.self_attn:k:rope", "rope", "fp32-angles", "float32") in keys
    # nothing sketched twice: no stream of the unpatched variants (the module hooks and the rotary
    # wrapper left these calls to the kernels)
    assert {k[2] for k in keys} == {"triton", "fp32-angles"}
    assert len(keys) == 11
    for p, x in norm_inputs.items():  # the fused features are optwin.ingest's
        got = mon.last_sketches[(f"{p}:rmsnorm", "rmsnorm", "triton", "float32")]
        close(got, sketch("rmsnorm", {"x": x, "weight": norms[p].weight.detach()}))
    rope = mon.last_sketches[("model.layers.1.self_attn:q:rope", "rope", "fp32-angles", "float32")]
    assert rope["max_pos"] == SEQ - 1 and rope["base"] == model.config.rope_parameters["rope_theta"]
    assert (rope["seq"], rope["heads"], rope["d"]) == (2 * SEQ, 4, 16)  # batch * seq rows, as capture flattens
    with torch.no_grad(), optwin.kernels.patch(model), \
            om.monitor(model, db=db, sampling="always", ops=("rope",)) as mon2:
        model(IDS)
        model(IDS[:, :4])  # new positions: max_pos follows them
    rope = mon2.last_sketches[("model.layers.1.self_attn:k:rope", "rope", "fp32-angles", "float32")]
    assert rope["max_pos"] == 3 and rope["seq"] == 2 * 4


def test_unsampled_calls_launch_without_the_sketch(db):
    model = _llama()
    every_third = SamplingConfig(warmup_calls=1, base_rate=1 / 3, min_rate=1 / 3)
    with torch.no_grad(), optwin.kernels.patch(model) as handle, \
            om.monitor(model, db=db, sampling=every_third, ops=("rmsnorm", "rope")) as mon:
        for _ in range(4):
            model(IDS)
    assert handle.calls == {"rmsnorm": 20, "rope": 16, "softmax": 8}
    # per stream: the warm-up call, then every third of the remaining 3; softmax is not watched
    assert handle.sketched == {"rmsnorm": 5 * 2, "rope": 4 * 2}
    assert mon.stats.checked == 18 and {k[1] for k in mon.streams} == {"rmsnorm", "rope"}


def test_raise_policy_sketches_before_the_call_and_names_the_triton_variant(db):
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(16, 48), nn.LayerNorm(48), nn.GELU(), nn.LayerNorm(48))
    x = torch.randn(5, 16)
    with torch.no_grad(), optwin.kernels.patch(net) as handle:
        with om.monitor(net, db=db, policy="raise", sampling="always") as mon:
            assert sketch_sink.active() is None  # "raise" needs the verdict before the kernel runs
            net(x)
        assert handle.calls == {"layernorm": 2} and not handle.sketched
        assert ("1:layernorm", "layernorm", "triton", "float32") in mon.streams
        with om.monitor(net, db=db, sampling="always") as warn:  # the same net under "warn": fused
            h = net[0](x)
            net(x)
    assert handle.sketched == {"layernorm": 2}
    got = warn.last_sketches[("1:layernorm", "layernorm", "triton", "float32")]
    m = net[1]
    close(got, sketch("layernorm", {"x": h, "weight": m.weight.detach(), "bias": m.bias.detach()}))
    close(got, mon.last_sketches[("1:layernorm", "layernorm", "triton", "float32")])  # before the call = fused


def _scaled(model: nn.Module, factor: float) -> None:
    """Scale every layer's query projection to `factor` times its initial weights: attention scores
    grow with it and the rows of the causal softmax turn peaked."""
    for layer in model.model.layers:
        q = layer.self_attn.q_proj
        if not hasattr(q, "_w0"):
            q._w0 = q.weight.detach().clone()
        with torch.no_grad():
            q.weight.copy_(q._w0 * factor)


FACTORS = [2.0 ** (k / 2) for k in range(25)]  # the database's sweep: 1 .. 4096
STEP = 3
DRIFT = FACTORS[::STEP]  # the monitored run: every third factor of the sweep (a sketched call takes ~1.5 s interpreted)
IDS1 = IDS[:1]  # one sequence: (1, seq)


def _softmax_cases(model: nn.Module, monkeypatch) -> list[dict]:
    """Twin outcomes (softmax/triton, float32, stochastic replays) of the model's own attention scores
    over the FACTORS sweep: the fingerprint cases of the database the last test matches against."""
    from optwin.kernels import patching

    seen: list[torch.Tensor] = []
    real = patching.softmax

    def recording(x, **kw):  # the real kernel, after keeping its input
        seen.append(x.detach().clone())
        return real(x, **kw)

    monkeypatch.setattr(patching, "softmax", recording)
    with torch.no_grad(), optwin.kernels.patch(model):
        for f in FACTORS:
            _scaled(model, f)
            model(IDS1)
    monkeypatch.setattr(patching, "softmax", real)
    return [twin_case("softmax", "triton", "float32", {"x": x}, seed=i) for i, x in enumerate(seen)]


def test_drift_to_peaked_attention_warns_through_the_fused_sketch(tmp_path, monkeypatch):
    model = _llama()
    cases = _softmax_cases(model, monkeypatch)
    faulting = [c["det"]["low_entropy"] for c in cases]
    assert not faulting[0] and faulting[-1]  # the sweep crosses the fault boundary
    path = str(tmp_path / "softmax-triton.duckdb")
    write_db(path, cases=cases)
    warned_at: list[int] = []
    clock = iter(range(10_000))
    with torch.no_grad(), optwin.kernels.patch(model) as handle, \
            om.monitor(model, db=path, sampling="always", ops=("softmax",), clock=lambda: float(next(clock))) as mon:
        for step, f in enumerate(DRIFT):
            _scaled(model, f)
            n = mon.stats.warnings
            model(IDS1)
            if mon.stats.warnings > n:
                warned_at.append(step)
    assert handle.sketched == {"softmax": 2 * len(DRIFT)}
    # a drift step faults when either layer's softmax does (two cases per factor, layer 0 first)
    first_fault = [faulting[2 * k] or faulting[2 * k + 1] for k in range(0, len(FACTORS), STEP)].index(True)
    assert warned_at, "no warning while the attention turned peaked"
    assert warned_at[0] <= first_fault, f"first warning at step {warned_at[0]}, first fault at {first_fault}"
    assert warned_at[0] > 0  # diffuse attention does not warn
    softmax_warnings = [w for w in mon.warnings if w["op"] == "softmax"]
    assert softmax_warnings and all(w["variant"] == "triton" for w in softmax_warnings)


def test_a_monitor_started_before_the_patch_still_takes_the_fused_sketch(db):
    """`with monitor(...), patch(...)`: the patch replaces the monitor's rotary/attention wrappers, and
    unwinding in reverse order leaves transformers' own functions in place."""
    from transformers.models.llama import modeling_llama

    original = modeling_llama.apply_rotary_pos_emb
    model = _llama()
    with torch.no_grad(), om.monitor(model, db=db, sampling="always", ops=("rmsnorm", "rope", "softmax")) as mon, \
            optwin.kernels.patch(model) as handle:
        model(IDS)
    assert handle.sketched == {"rmsnorm": 5, "rope": 4, "softmax": 2}
    assert {k[2] for k in mon.streams} == {"triton", "fp32-angles"} and mon.stats.checked == 11
    assert modeling_llama.apply_rotary_pos_emb is original
    assert sketch_sink.active() is None and not sketch_sink.FUSED


def test_deferred_softmax_sketches_reach_the_monitor_at_its_flush(db, monkeypatch):
    """A bf16 model whose attention rows take softmax's row launch (ROWS_BLOCKS widened to 16: rows of 16
    scores, 16-bit pairs): the patched softmax defers its finisher (optwin.kernels.deferred), the monitor queues each
    call until its page settles (here: the monitor's flush at stop), and the features it assesses are
    ingest's of the very scores."""
    from optwin.kernels import deferred, launch_plan, patching
    from optwin.kernels import softmax as softmax_mod

    monkeypatch.setattr(softmax_mod, "ROWS_BLOCKS", {16})
    monkeypatch.setattr(launch_plan, "_KEPT", {})  # plans read ROWS_BLOCKS when built: none from before, none kept after
    monkeypatch.setattr(deferred, "MAX_AGE_S", 1e9)  # no page goes stale in the interpreter's slow calls
    scores: list[torch.Tensor] = []
    pending: list[bool] = []
    real = patching.softmax

    def spy(x, sketch=True, out_dtype=None, defer=False):
        y, buf = real(x, sketch=sketch, out_dtype=out_dtype, defer=defer)
        scores.append(x.detach().clone())
        pending.append(buf is not None and deferred.pending(buf))
        return y, buf

    monkeypatch.setattr(patching, "softmax", spy)
    model = load_llama_tiny("eager", dtype=torch.bfloat16).module
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad(), optwin.kernels.patch(model) as handle, \
            om.monitor(model, db=db, sampling="always", ops=("softmax",)) as mon:
        model(ids)
        assert pending == [True, True] and mon.stats.checked == 0  # both wait for their page
    assert handle.sketched == {"softmax": 2} and mon.stats.checked == 2
    for layer, x in enumerate(scores):
        got = mon.last_sketches[(f"model.layers.{layer}.self_attn:softmax", "softmax", "triton", "bfloat16")]
        close(got, sketch("softmax", {"x": x}))
    assert deferred.leftover() == (0, 0)
    # a page older than MAX_AGE_S settles at the monitor's next call: layer 1's call settles layer 0's
    monkeypatch.setattr(deferred, "MAX_AGE_S", 0.0)
    with torch.no_grad(), optwin.kernels.patch(model), \
            om.monitor(model, db=db, sampling="always", ops=("softmax",)) as mon2:
        model(ids)
        assert mon2.stats.checked == 1
    assert mon2.stats.checked == 2


def test_deferred_layernorm_sketches_reach_the_monitor_at_its_flush(db, monkeypatch):
    """A bf16 nn.LayerNorm of 4096 (the Welford row launch): the patched layernorm defers its finisher
    (optwin.kernels.deferred), the monitor queues the call until its page settles at its flush, and the
    features it assesses are ingest's of the very input, the parameters' included."""
    from optwin.kernels import deferred

    monkeypatch.setattr(deferred, "MAX_AGE_S", 1e9)  # no page goes stale in the interpreter's slow calls
    torch.manual_seed(5)
    net = nn.Sequential(nn.Linear(8, 4096), nn.LayerNorm(4096)).to(torch.bfloat16)
    with torch.no_grad():
        net[1].weight.uniform_(0.5, 2.0)
        net[1].bias.uniform_(-1, 1)
        x = torch.randn(3, 8, dtype=torch.bfloat16)
        h = net[0](x)
        with optwin.kernels.patch(net) as handle, \
                om.monitor(net, db=db, sampling="always", ops=("layernorm",)) as mon:
            net(x)
            assert mon.stats.checked == 0  # the call waits for its page
        assert handle.sketched == {"layernorm": 1} and mon.stats.checked == 1
    got = mon.last_sketches[("1:layernorm", "layernorm", "triton", "bfloat16")]
    close(got, sketch("layernorm", {"x": h, "weight": net[1].weight, "bias": net[1].bias}))
    assert deferred.leftover() == (0, 0)
