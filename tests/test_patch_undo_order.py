"""A patch's undo among monitors that start and stop out of nesting order.

    python -m pytest -q tests/test_patch_undo_order.py

The patch replaces transformers' module globals (apply_rotary_pos_emb, eager_attention_forward) and the
monitor wraps whatever is installed, so each may find the other's function there. The undo used to put
back what it found unconditionally: undone under a monitor started after the patch, it overwrote the
monitor's wrapper (the monitor saw no rope or attention for the rest of its run); undone after a monitor
that started first had stopped, it put back the monitor's idle wrapper for good. A tiny random-weight
transformers Llama (eager attention) runs the kernels under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers.models.llama import modeling_llama as M  # noqa: E402

import optwin.kernels  # noqa: E402
import optwin.monitor as om  # noqa: E402
from optwin.ingest.models import load_llama_tiny  # noqa: E402
from optwin.kernels import sketch_sink  # noqa: E402

IDS = torch.randint(0, 1000, (2, 5), generator=torch.Generator().manual_seed(1))  # (batch, seq)
NAMES = ("apply_rotary_pos_emb", "eager_attention_forward")


@pytest.fixture
def originals():
    """transformers' functions, put back whatever a failing test left installed (they are process-wide)."""
    saved = {n: getattr(M, n) for n in NAMES}
    yield saved
    for n, fn in saved.items():
        setattr(M, n, fn)


def _reference(model, db: str) -> tuple[set, int]:
    """The streams and check count of a monitor on the unpatched model."""
    with torch.no_grad(), om.monitor(model, db=db, sampling="always") as mon:
        model(IDS)
    return set(mon.streams), mon.stats.checked


def test_undo_under_a_monitor_started_after_the_patch_leaves_it_watching(db, originals):
    model = load_llama_tiny("eager").module
    want_streams, want_checked = _reference(model, db)
    assert {k[1] for k in want_streams} >= {"rope", "attention"}
    with torch.no_grad():
        handle = optwin.kernels.patch(model)
        mon = om.monitor(model, db=db, sampling="always").start()
        try:
            handle.undo()
            launched = dict(handle.calls)
            model(IDS)
        finally:
            mon.stop()
    # the monitor kept its wrappers: it saw what it sees on the unpatched model (rope and attention included)
    assert set(mon.streams) == want_streams and mon.stats.checked == want_checked
    assert dict(handle.calls) == launched  # undone: its functions, still under the wrapper, launch nothing
    for n in NAMES:  # the monitor's stop put transformers' own functions back
        assert getattr(M, n) is originals[n], n
    assert sketch_sink.active() is None


def test_undo_after_a_monitor_that_started_first_stopped_puts_back_the_originals(db, originals):
    model = load_llama_tiny("eager").module
    with torch.no_grad():
        mon = om.monitor(model, db=db, sampling="always").start()
        handle = optwin.kernels.patch(model)
        mon.stop()  # leaves the patch's functions in place: they are not its wrapper
        handle.undo()
    for n in NAMES:  # not the monitor's wrapper, idle since its stop
        assert getattr(M, n) is originals[n], n
    # and a later monitor finds transformers' functions to wrap: it sees rope and attention
    assert {k[1] for k in _reference(model, db)[0]} >= {"rope", "attention"}


def test_undo_leaves_a_replacement_made_after_the_patch(originals):
    model = load_llama_tiny("eager").module
    handle = optwin.kernels.patch(model)
    assert M.apply_rotary_pos_emb is not originals["apply_rotary_pos_emb"]

    def mine(*args, **kwargs):  # a user's own monkeypatch over the patch's function
        return originals["apply_rotary_pos_emb"](*args, **kwargs)

    M.apply_rotary_pos_emb = mine
    handle.undo()
    assert M.apply_rotary_pos_emb is mine  # theirs stays; the global the patch still held is restored
    assert M.eager_attention_forward is originals["eager_attention_forward"]


def test_undo_between_two_monitors_leaves_no_idle_wrapper_once_both_stop(db, originals):
    # monitor 0, patch, monitor 1 (wraps the patch's function), undo (monitor 1's wrapper now falls back to
    # monitor 0's, still in use), monitor 0 stops, monitor 1 stops: its stop put back monitor 0's idle wrapper
    model = load_llama_tiny("eager").module
    m0 = om.monitor(model, db=db, sampling="always").start()
    h = optwin.kernels.patch(model)
    m1 = om.monitor(model, db=db, sampling="always").start()
    h.undo()
    m0.stop()
    m1.stop()
    assert M.apply_rotary_pos_emb is originals["apply_rotary_pos_emb"]
    assert M.eager_attention_forward is originals["eager_attention_forward"]
