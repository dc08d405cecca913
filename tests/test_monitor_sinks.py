"""Several "warn" monitors on patched models: each gets the kernels' fused sketch of its own calls.

    python -m pytest -q tests/test_monitor_sinks.py

A patched call used to ask only the innermost monitor (optwin.kernels.sketch_sink). That one says no
to an op outside its `ops` and to another thread's call, while every monitor's capture hooks had
already left the call's sketch to the kernel: a second monitor, nested or in another thread, silently
stopped the first one checking rmsnorm, rope and softmax (28 checks per forward fell to 17). Tiny
random-weight Llamas run our Triton kernels under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import threading  # noqa: E402

import torch  # noqa: E402

import optwin.kernels  # noqa: E402
import optwin.monitor as om  # noqa: E402
from optwin.ingest.models import load_llama_tiny  # noqa: E402

IDS = torch.randint(0, 1000, (2, 5), generator=torch.Generator().manual_seed(1))
FUSED_OPS = ("rmsnorm", "rope", "softmax")


def _fused_streams(mon: om.Monitor) -> dict[str, int]:
    """Per fused op, how many of the monitor's streams hold it (q and k rope streams per layer, ...)."""
    out = {op: 0 for op in FUSED_OPS}
    for key in mon.streams:
        if key[1] in out:
            out[key[1]] += 1
    return out


def test_nested_monitors_both_get_the_fused_calls_they_watch(db):
    model = load_llama_tiny("eager").module
    with torch.no_grad(), optwin.kernels.patch(model):
        with om.monitor(model, db=db, sampling="always") as alone:
            model(IDS)
        with om.monitor(model, db=db, sampling="always") as outer:
            # the inner one watches softmax only: it says no to rmsnorm and rope, which the outer wants
            with om.monitor(model, db=db, sampling="always", ops=("softmax",)) as inner:
                model(IDS)
    # 2 layers: 5 norms, q and k rotated per layer, a softmax per layer
    assert _fused_streams(alone) == {"rmsnorm": 5, "rope": 4, "softmax": 2}
    assert _fused_streams(outer) == _fused_streams(alone)
    assert outer.stats.checked == alone.stats.checked and outer.stats.skipped == 0
    assert _fused_streams(inner) == {"rmsnorm": 0, "rope": 0, "softmax": 2}
    assert inner.stats.checked == 2


def test_monitors_in_two_threads_each_check_their_own_model(db):
    models = {"A": load_llama_tiny("eager").module, "B": load_llama_tiny("eager").module}
    handles = [optwin.kernels.patch(m) for m in models.values()]
    with torch.no_grad(), om.monitor(models["A"], db=db, sampling="always") as ref:
        models["A"](IDS)
    res: dict[str, om.Monitor] = {}
    errors: list[BaseException] = []
    both_running, both_done = threading.Barrier(2, timeout=60), threading.Barrier(2, timeout=60)
    one_at_a_time = threading.Lock()  # the Triton interpreter is not thread-safe; both monitors still run

    def work(name: str) -> None:
        try:
            with torch.no_grad(), om.monitor(models[name], db=db, sampling="always") as mon:
                both_running.wait()
                with one_at_a_time:
                    models[name](IDS)
                both_done.wait()
            res[name] = mon
        except BaseException as e:  # noqa: BLE001  reported by the main thread
            errors.append(e)

    try:
        threads = [threading.Thread(target=work, args=(n,)) for n in models]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for h in handles:
            h.undo()
    assert not errors, errors
    for name, mon in sorted(res.items()):
        assert _fused_streams(mon) == _fused_streams(ref), name
        assert (mon.stats.checked, mon.stats.skipped) == (ref.stats.checked, 0), name
