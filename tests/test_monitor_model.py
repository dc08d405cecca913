"""The in-process monitor on a real PyTorch model: warn / fallback / raise, sampling, async readback.

    python -m pytest -q tests/test_monitor_model.py
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import optwin.monitor as om
from _monitor_fixture import NativeRMSNorm, fake_clock, rows_of_absmax
from optwin.errors import CatalogError, OptwinError
from optwin.fingerprints.sidecar import SidecarConfig, SidecarThread


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = NativeRMSNorm(64)
        self.proj = nn.Linear(64, 64).half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))  # (rows, 64)


def _drift(mon_kwargs: dict, db: str, n: int = 140) -> tuple[list[bool], om.Monitor, int | None]:
    torch.manual_seed(0)
    model = Block()
    g = torch.Generator().manual_seed(1)
    finite = []
    first_bad = None
    normed: list[torch.Tensor] = []
    with om.monitor(model, db=db, clock=fake_clock(), **mon_kwargs) as mon:
        # after the monitor's own hooks: sees the output the model goes on with
        model.norm.register_forward_hook(lambda m, a, out: normed.append(out.detach()))
        for i in range(n):
            model(rows_of_absmax(g, 8.0 * 2 ** (i / 20)))  # |x| doubles every 20 calls: 256 at call 100
            y = normed[-1].double()  # (4, 64): a normalized row has rms 1
            ok = bool(torch.isfinite(y).all()) and float(y.square().mean(-1).sqrt().min()) > 0.5
            finite.append(ok)
            if not ok and first_bad is None:
                first_bad = i
    return finite, mon, first_bad


def test_warn_policy_warns_before_the_first_bad_output(db, caplog):
    with caplog.at_level(logging.WARNING, logger="optwin.monitor"):
        seen = []
        finite, mon, first_bad = _drift({"callbacks": [seen.append], "sampling": "default"}, db)
    assert first_bad is not None  # the model really breaks (warn changes nothing)
    norm = [w for w in mon.warnings if w["stream"] == "norm:rmsnorm"]
    assert norm and norm[0]["variant"] == "native-dtype"
    # the stream clock ticks once per catalog call (2 per forward): call index = t / 0.5 / 2
    first_warn_call = norm[0]["t"] / 0.5 / 2
    assert first_warn_call < first_bad
    assert seen == mon.warnings and any("norm:rmsnorm" in r.message for r in caplog.records)
    # the linear (matmul/torch) was never built into the fixture: unknown, but no warning storm
    assert not [w for w in mon.warnings if w["op"] == "matmul"]


def test_fallback_policy_keeps_outputs_finite(db):
    finite, mon, first_bad = _drift({"policy": "fallback", "sampling": "always"}, db)
    assert first_bad is None, "fallback should have run the overflowing norm in float32"
    assert mon.stats.fallbacks > 0


def test_raise_policy_raises_before_the_faulting_call(db):
    model = Block()
    g = torch.Generator().manual_seed(2)
    with om.monitor(model, db=db, policy="raise", sampling="always", clock=fake_clock()) as mon:
        model(rows_of_absmax(g, 10.0))
        with pytest.raises(om.FaultPredicted, match="norm:rmsnorm.*predicted to fault") as e:
            model(rows_of_absmax(g, 600.0))
        assert isinstance(e.value, OptwinError)
        assert mon._rec.suppress == 0 and not mon._rec._stack  # the raising pre-hook held no count
        model(rows_of_absmax(g, 10.0))  # the monitor keeps working after a raise
    assert mon.stats.raised == 1


def test_sampling_skips_sketches_after_warmup(db):
    model = Block()
    g = torch.Generator().manual_seed(3)
    with om.monitor(model, db=db, clock=fake_clock()) as mon:
        for _ in range(400):
            model(rows_of_absmax(g, 4.0))
    assert mon.stats.calls == 800
    assert 200 <= mon.stats.checked <= 210  # 100 per stream, then 1%


def test_unsampled_matmul_calls_make_no_input_views(db, monkeypatch):
    """F.linear's handler hands over a function making its views (x as rows, w.T): the monitor calls it
    for the calls its sampling checks, and only for those (stop 19: two tensor ops per call before)."""
    import optwin.monitor as monitor_module

    made = []
    check = monitor_module.Monitor._check

    def counting_check(self, rec, op, variant, inputs, params, dtype, site):
        if op == "matmul":
            assert callable(inputs) and dtype == "float16"  # lazy, with the dtype given
            inner = inputs
            inputs = lambda: made.append(1) or inner()  # noqa: E731 - counts the views made
        return check(self, rec, op, variant, inputs, params, dtype, site)

    monkeypatch.setattr(monitor_module.Monitor, "_check", counting_check)
    model = Block()
    g = torch.Generator().manual_seed(3)
    with om.monitor(model, db=db, clock=fake_clock()) as mon:
        for _ in range(400):
            model(rows_of_absmax(g, 4.0))
    assert 100 <= len(made) <= 105  # the linear stream's 100 warm-up calls, then 1 %, not 400
    assert 200 <= mon.stats.checked <= 210  # and both streams still checked as before


def test_only_the_watched_ops_functions_are_wrapped(db):
    """A monitor of rmsnorm leaves F.linear (and every other intercepted function of an unwatched op)
    unwrapped: its calls never reach the monitor. Watching matmul wraps it; stopping unwraps it."""
    import torch.nn.functional as F

    from optwin.ingest import intercept

    model = Block()
    g = torch.Generator().manual_seed(3)
    plain = F.linear
    with om.monitor(model, db=db, ops=("rmsnorm",), clock=fake_clock()) as mon:
        assert F.linear is plain and torch.matmul is intercept.original(torch.matmul)
        model(rows_of_absmax(g, 4.0))
    assert mon.stats.calls == 1  # the norm's module hook; the projection is not a call it sees
    with om.monitor(model, db=db, ops=("rmsnorm", "matmul"), clock=fake_clock()) as mon:
        assert F.linear is not plain and intercept.original(F.linear) is plain
        model(rows_of_absmax(g, 4.0))
    assert mon.stats.calls == 2 and F.linear is plain


def test_async_readback_queue_drains(db):
    """The CUDA path (event-gated queue) run on CPU: sketches queue, are read on later calls."""
    model = Block()
    g = torch.Generator().manual_seed(4)
    with om.monitor(model, db=db, sampling="always", async_readback=True, clock=fake_clock()) as mon:
        for _ in range(3):
            model(rows_of_absmax(g, 600.0))
        assert mon.stats.checked == 6
    assert mon.stats.queued == 0 and any(w["stream"] == "norm:rmsnorm" for w in mon.warnings)


def test_async_readback_with_every_host_row_in_flight_waits_for_the_oldest(db, monkeypatch):
    """More sketches in flight than host rows: the oldest is assessed first, none is lost, and the
    queue never holds more than the rows."""
    monkeypatch.setattr(om, "HOST_SLOTS", 2)
    model = Block()
    with om.monitor(model, db=db, sampling="always", async_readback=True, clock=fake_clock()) as mon:
        s = mon._stream("norm:rmsnorm", "rmsnorm", "native-dtype", "float16")
        names = om.SKETCH_FEATURES["rmsnorm"]
        g = torch.Generator().manual_seed(6)
        sketches = []
        for absmax in (1.0, 2.0, 4.0, 8.0, 16.0):
            x = rows_of_absmax(g, absmax)
            values = om.sketch_tensor("rmsnorm", {"x": x, "weight": model.norm.weight.detach()})[1]
            sketches.append(values)
            mon._submit(mon._rec, s, names, values, {})
            assert len(mon._pending) <= 2
        assert mon.stats.checked == 5
        mon.flush()
        assert mon.stats.queued == 0
        last = mon.last_sketches[("norm:rmsnorm", "rmsnorm", "native-dtype", "float16")]
        assert last == dict(zip(names, sketches[-1].tolist()))  # the newest, read from its own row


def test_monitor_with_a_sidecar(db):
    with SidecarThread(db, config=SidecarConfig(max_lag_s=60.0)) as sc:  # shares the GIL: lag is not overload
        model = Block()
        g = torch.Generator().manual_seed(5)
        with om.monitor(model, sidecar=sc.url, sampling="always", clock=fake_clock()) as mon:
            for _ in range(5):
                model(rows_of_absmax(g, 600.0))
        assert any(w["source"] == "sidecar" and w["stream"] == "norm:rmsnorm" for w in mon.warnings)
        assert sc.state.metrics.records_ok == 10


def test_bad_arguments_are_one_line_errors(db):
    with pytest.raises(CatalogError, match="unknown monitor policy"):
        om.monitor(Block(), db=db, policy="explode")
    with pytest.raises(CatalogError, match="needs a local database"):
        om.monitor(Block(), sidecar="tcp://127.0.0.1:9", policy="raise")
    with pytest.raises(CatalogError, match="db=PATH"):
        om.monitor(Block())
    with pytest.raises(CatalogError, match="ops: unknown operator 'softmx'"):  # would watch nothing
        om.monitor(Block(), db=db, ops=("softmx",))
    with pytest.raises(CatalogError, match="sampling must be a preset name or a SamplingConfig"):
        om.monitor(Block(), db=db, sampling=5)
    from optwin.ingest import capture

    with pytest.raises(CatalogError, match="ops: unknown operator 'softmx'"):
        with capture(Block(), ops=["softmx"]):
            pass


def test_a_running_monitor_is_not_started_twice(db):
    softmax = torch.nn.functional.softmax
    mon = om.monitor(Block(), db=db)
    with mon:
        with pytest.raises(CatalogError, match="already running"):
            mon.start()
        assert torch.nn.functional.softmax is not softmax  # the first start's wrapper, still in place
    assert torch.nn.functional.softmax is softmax  # and removed with it
    with mon:  # stopped: it may start again
        pass
    assert torch.nn.functional.softmax is softmax


def test_fallback_keeps_the_dtype_the_call_asked_for():
    x = torch.randn(3, 8).half()
    f = torch.nn.functional.softmax
    assert om._in_float32(lambda *a, **k: f(*a, **k), (x, -1), {"dtype": torch.float32}).dtype == torch.float32
    assert om._in_float32(lambda *a, **k: f(*a, **k), (x, -1), {}).dtype == torch.float16


def test_optwin_monitor_is_callable_and_ingest_capture_still_the_function():
    import optwin
    import optwin.ingest

    assert callable(optwin.monitor) and callable(optwin.ingest.capture)
    assert optwin.ingest.capture.__name__ == "capture"


@pytest.mark.parametrize("first_stopped", ["outer", "inner"])
def test_monitors_stopped_out_of_order_keep_watching_and_restore_the_originals(db, first_stopped):
    """Two monitors on one HF model share the transformers wrappers: the one left running still sees rope and
    attention, and once both stop the modeling module's functions are the originals (a wrapper left behind made
    a later optwin.kernels.patch keep HF's rotary code, taking it for a capture's)."""
    import transformers.models.llama.modeling_llama as ml

    from optwin.ingest.models import load_llama_tiny

    model = load_llama_tiny("eager").module
    originals = (ml.apply_rotary_pos_emb, ml.eager_attention_forward)
    outer = om.Monitor(model, db=db, sampling="always").start()
    inner = om.Monitor(model, db=db, sampling="always").start()
    stop, keep = (outer, inner) if first_stopped == "outer" else (inner, outer)
    stop.stop()
    with torch.no_grad():
        model(input_ids=torch.randint(1, 999, (1, 5)))
    keep.flush()
    assert {"rope", "attention"} <= {k[1] for k in keep.streams}
    keep.stop()
    assert (ml.apply_rotary_pos_emb, ml.eager_attention_forward) == originals
