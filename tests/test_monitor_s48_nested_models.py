"""Two models, each under its own monitor in the same thread (nested), run alternately: each monitor records its
own model's calls only, rope with its own model's positions and base.

    python -m pytest -q tests/test_monitor_s48_nested_models.py

Every monitor active in a thread is handed every wrapped torch function (matmul, softmax), wrapped transformers
function (eager attention, rope) and patched kernel call (sketch_sink's fan-out). Each monitor used to record the
other model's calls too, in streams without a module path ("matmul", "attention", ":q:rope", "rmsnorm" for patched
norms), rope with its own model's positions and base: one model's faulting calls fed the other's forecasters and
verdicts. Model A runs at positions past 100000 with base 10000, model B at 0..7 with base 500000, so a rope call
recorded under the wrong monitor shows. Tiny random-weight Llamas; the patched case runs our Triton kernels under
TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

import optwin.kernels  # noqa: E402
import optwin.monitor as om  # noqa: E402
from _monitor_fixture import eager_llama  # noqa: E402

SEQ = 8
FAR = 100000  # A's first position: fp32 angles lose the position there (rope's fault driver)




IDS = torch.randint(1, 100, (1, SEQ), generator=torch.Generator().manual_seed(1))  # (1, SEQ)


def _run_a(a: torch.nn.Module) -> None:
    a(IDS, position_ids=torch.arange(SEQ)[None] + FAR)


def _ropes(mon: om.Monitor) -> dict[str, tuple[float, float]]:
    """(max_pos, base) of every rope stream the monitor assessed."""
    return {k[0]: (v["max_pos"], v["base"]) for k, v in mon.last_sketches.items() if k[1] == "rope"}


def _alone(db: str, model: torch.nn.Module, run) -> tuple[set, int]:  # noqa: ANN001
    """A lone monitor's streams and call count over two forwards: what each nested monitor must see of its model."""
    with om.Monitor(model, db=db, sampling="always") as mon:
        run()
        run()
    return set(mon.streams), mon.stats.calls


@pytest.mark.parametrize("patched", [False, True])
@pytest.mark.parametrize("a_outer", [True, False])
def test_nested_monitors_record_only_their_own_models_calls(db, patched, a_outer):
    a, b = eager_llama(10000.0, 0), eager_llama(500000.0, 1)
    pa, pb = (optwin.kernels.patch(a), optwin.kernels.patch(b)) if patched else (nullcontext(), nullcontext())
    with torch.no_grad(), pa, pb:
        want_a, want_b = _alone(db, a, lambda: _run_a(a)), _alone(db, b, lambda: b(IDS))
        ma, mb = om.Monitor(a, db=db, sampling="always"), om.Monitor(b, db=db, sampling="always")
        first, second = (ma, mb) if a_outer else (mb, ma)
        with first, second:
            for _ in range(2):  # alternately: each monitor meets the other model's calls between its own
                _run_a(a)
                b(IDS)
    for mon, (streams, calls) in ((ma, want_a), (mb, want_b)):
        assert set(mon.streams) == streams and mon.stats.calls == calls
        # every stream sits in the model (the leak's streams had no module path: "matmul", ":q:rope")
        assert all(s[0].startswith(("model.", "lm_head:")) for s in mon.streams), sorted(mon.streams)
    kinds = {(k[1], k[2]) for k in ma.streams}
    assert ("rmsnorm", "triton" if patched else "fp32-acc") in kinds and ("rope", "fp32-angles") in kinds
    a_rope, b_rope = (SEQ - 1.0 + FAR, 10000.0), (SEQ - 1.0, 500000.0)
    site = "model.layers.0.self_attn"
    assert _ropes(ma) == {f"{site}:q:rope": a_rope, f"{site}:k:rope": a_rope}
    assert _ropes(mb) == {f"{site}:q:rope": b_rope, f"{site}:k:rope": b_rope}


def test_a_call_in_neither_model_is_still_every_monitors(db):
    """The user's own torch call in the block belongs to no model: each monitor records it, as a lone one does."""
    a, b = eager_llama(10000.0, 0), eager_llama(500000.0, 1)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))  # (4, 16)
    with torch.no_grad(), om.Monitor(a, db=db, sampling="always") as ma, om.Monitor(b, db=db, sampling="always") as mb:
        torch.softmax(x, -1)
        b(IDS)
    assert set(ma.streams) == {("softmax", "softmax", "torch", "float32")}  # and none of B's calls
    assert ("softmax", "softmax", "torch", "float32") in mb.streams
