"""The hand-off between patched kernels and a running monitor: the kernels' fused sketch buffers go to
the monitor, which then computes no sketch of its own for those calls.

    with optwin.kernels.patch(model), optwin.monitor(model, db="fp.duckdb") as mon:
        model(**batch)      # the norms, softmax and rotary run our kernels; sampled calls launch with
                            # the sketch on and hand their buffer to `mon`

A patched forward asks the active sinks whether this call should be sketched (`wants`: each
monitor's per-stream sampling, so unsampled calls launch without the sketch) and, if any does, hands
the buffer to each that does after the launch (`take`). Modules whose forward a patch swapped are
listed in FUSED, so the capture hooks know that the module runs the `triton` variant and, under a
sink, leave its sketch to the kernel. Pure Python: importing it imports neither triton nor the kernels.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol

import torch
from torch import nn

# Modules whose forward optwin.kernels.patch swapped for a kernel that can emit the sketch -> op.
FUSED: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()

# The patched rotary/attention functions carry this attribute (the op whose sketch they emit), so a
# capture wrapper around them can tell (see fused_function).
FUSED_ATTR = "__optwin_fused__"


class Sink(Protocol):
    """What a patched kernel call talks to (optwin.monitor's recorder implements it)."""

    def wants(self, op: str, variant: str, dtype: torch.dtype, suffix: str = "") -> Any:
        """A token if this call should launch with the sketch (None: launch without). `variant` is the
        catalog variant whose numerics the call has; `suffix` names the operand of a call site that
        has several (rope's "q" and "k")."""

    def take(self, token: Any, buf: torch.Tensor) -> None:
        """The launch's sketch buffer (float64 on the device, still being written by the stream)."""


class _Fanout:
    """The sink patched kernels see while several are active: asks each one (innermost first) and hands
    the buffer to every one that wants the call.

    Asking only the innermost lost calls: its `wants` says None for another thread's call (each monitor
    records only its own thread) and for an op outside its `ops`, while the other monitors' capture hooks
    had already left that call's sketch to the kernel, so nobody sketched or counted it (a second
    monitor, nested or in another thread, silently stopped the first one checking rmsnorm, rope and
    softmax). Every sink is asked, not just the first that says yes, so each monitor counts and samples
    its own calls whichever other monitors run. A monitor with a model turns down a call inside another
    monitor's model (capture.Recorder.foreign), so monitors of different models share a buffer only for a call
    inside neither (a user's own rope call in the `with` block). Then each reads the buffer, except rope's two
    tail features (max position, base), which each monitor writes (from the rotary call its own hooks saw last)
    just before reading them, and each still reads its own: take hands the buffer to one sink at a time, a
    monitor reads the features before returning (on CUDA its device-to-host copy is queued behind its write and
    ahead of the next sink's, on the same stream), and rope's launch never defers its buffer."""

    __slots__ = ("sinks",)

    def __init__(self, sinks: tuple[Sink, ...]) -> None:
        self.sinks = sinks

    def wants(self, op: str, variant: str, dtype: torch.dtype, suffix: str = "") -> Any:
        taken = [(s, t) for s in self.sinks if (t := s.wants(op, variant, dtype, suffix)) is not None]
        return taken or None

    def take(self, token: Any, buf: torch.Tensor) -> None:
        for sink, t in token:
            sink.take(t, buf)


# The active sinks, innermost last: a tuple replaced whole under _LOCK (monitors start and stop from
# several threads; a kernel call reads a snapshot without the lock). _ACTIVE is what active() returns:
# the lone sink itself (the common case costs no extra call), or a _Fanout over all of them.
_LOCK = threading.Lock()
_SINKS: tuple[Sink, ...] = ()
_ACTIVE: Sink | None = None


def _set(sinks: tuple[Sink, ...]) -> None:
    global _SINKS, _ACTIVE
    _SINKS = sinks
    _ACTIVE = None if not sinks else sinks[0] if len(sinks) == 1 else _Fanout(sinks[::-1])


def active() -> Sink | None:
    """The sink patched calls talk to, or None (then patched calls never sketch): the one active sink, or
    with several, one that asks each of them (innermost first) and gives the buffer to all that want it."""
    return _ACTIVE


def push(sink: Sink) -> None:
    with _LOCK:
        _set(_SINKS + (sink,))


def remove(sink: Sink) -> None:
    """Take `sink` off the stack (wherever it is: monitors may stop out of order)."""
    with _LOCK:
        for i in range(len(_SINKS) - 1, -1, -1):
            if _SINKS[i] is sink:
                _set(_SINKS[:i] + _SINKS[i + 1:])
                return


def fused_op(module: nn.Module) -> str | None:
    """The op a patched module's kernel sketches, or None for a module no patch touched."""
    return FUSED.get(module)


def fused_function(fn: Any) -> str | None:
    """The op a patched function's kernel sketches, or None."""
    return getattr(fn, FUSED_ATTR, None)
