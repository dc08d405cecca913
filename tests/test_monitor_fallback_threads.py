"""policy="fallback" with a second thread running the monitored model: the owner's float32 rerun stays the owner's.

    python -m pytest -q tests/test_monitor_fallback_threads.py

The monitor flags a predicted-to-fault RMSNorm module (its id in rec.fallback_modules) in the owner
thread's pre-hook; the forward hook that reruns it in float32 used the flag whatever thread ran it.
Another thread's call of the same module, finishing between the owner's pre-hook and forward hook,
took the flag (and a float32 rerun it was never checked for), and the owner's overflowing output went
on unchanged.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

import optwin.monitor as om
from _monitor_fixture import NativeRMSNorm


def _x(absmax: float, seed: int) -> torch.Tensor:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)  # (4, 64)
    return (x / x.abs().max() * absmax).half()


def test_another_threads_call_does_not_take_the_owners_fallback(db):
    norm = NativeRMSNorm(64)
    flagged, other_done = threading.Event(), threading.Event()
    owner = threading.get_ident()
    out: dict[str, torch.Tensor] = {}

    def hold(m: nn.Module, args: tuple) -> None:  # registered after the monitor's pre-hook: the flag is set
        if threading.get_ident() == owner:
            flagged.set()
            assert other_done.wait(30)

    def other() -> None:
        assert flagged.wait(30)
        try:
            with torch.no_grad():
                out["other"] = norm(_x(4.0, 2))  # a safe call: this thread is not the monitor's
        finally:
            other_done.set()

    with torch.no_grad(), om.monitor(norm, db=db, policy="fallback", sampling="always") as mon:
        h = norm.register_forward_pre_hook(hold)
        t = threading.Thread(target=other)
        t.start()
        try:
            y = norm(_x(600.0, 1))  # x*x overflows float16: predicted, rerun in float32
        finally:
            other_done.set()
            t.join(30)
            h.remove()
    assert mon.stats.fallbacks == 1
    assert "other" in out
    # without its rerun the owner's output is 0 (x*x overflows: rsqrt(inf)); a normalized row has rms 1
    rms = y.double().square().mean(-1).sqrt()  # (4,)
    assert torch.allclose(rms, torch.ones(4, dtype=torch.float64), rtol=1e-2), \
        f"the owner's fallback was taken by the other thread's call: row rms {rms.tolist()}"
    assert not mon._rec.fallback_modules  # the owner's post used its flag


def test_a_patched_kernel_called_from_another_thread_is_not_the_monitors(db):
    """optwin.kernels' sketch sink is process-wide: a patched call from another thread asked the owner's monitor
    whether to sketch, fed it that thread's calls and touched its samplers from two threads."""
    from optwin.kernels import sketch_sink

    with om.monitor(NativeRMSNorm(64), db=db, sampling="always"):
        sink = sketch_sink.active()
        assert sink.wants("rmsnorm", "triton", torch.float16) is not None  # the owner thread's call is sampled
        other: list = []
        t = threading.Thread(target=lambda: other.append(sink.wants("rmsnorm", "triton", torch.float16)))
        t.start()
        t.join()
    assert other == [None]
