"""The hand-off between patched kernels and a running monitor: the kernels' fused sketch buffers go to
the monitor, which then computes no sketch of its own for those calls.

    with optwin.kernels.patch(model), optwin.monitor(model, db="fp.duckdb") as mon:
        model(**batch)      # the norms, softmax and rotary run our kernels; sampled calls launch with
                            # the sketch on and hand their buffer to `mon`

A patched forward asks the innermost active sink whether this call should be sketched
(`wants`: the monitor's per-stream sampling, so unsampled calls launch without the sketch) and, if
so, hands it the buffer after the launch (`take`). Modules whose forward a patch swapped are listed
in FUSED, so the capture hooks know that the module runs the `triton` variant and, under a sink,
leave its sketch to the kernel. Pure Python: importing it imports neither triton nor the kernels.
"""

from __future__ import annotations

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


_SINKS: list[Sink] = []


def active() -> Sink | None:
    """The innermost sink that takes fused sketches, or None (then patched calls never sketch)."""
    return _SINKS[-1] if _SINKS else None


def push(sink: Sink) -> None:
    _SINKS.append(sink)


def remove(sink: Sink) -> None:
    """Take `sink` off the stack (wherever it is: monitors may stop out of order)."""
    for i in range(len(_SINKS) - 1, -1, -1):
        if _SINKS[i] is sink:
            del _SINKS[i]
            return


def fused_op(module: nn.Module) -> str | None:
    """The op a patched module's kernel sketches, or None for a module no patch touched."""
    return FUSED.get(module)


def fused_function(fn: Any) -> str | None:
    """The op a patched function's kernel sketches, or None."""
    return getattr(fn, FUSED_ATTR, None)
