"""The dtype a catalog call computes in under torch.autocast (capture and monitor label calls with it).

    python -c "import torch; from optwin.ingest.autocast_dtype import call_dtype; \
x = torch.ones(2, 2); ctx = torch.autocast('cpu', dtype=torch.float16); ctx.__enter__(); print(call_dtype('matmul', x))"

Under autocast an op does not compute in its inputs' dtype: F.linear of float32 inputs under
autocast(float16) casts them and runs a float16 GEMM (it can overflow to inf), so a call labelled
with its inputs' float32 would be looked up in the wrong fingerprints. The tables mirror
aten/src/ATen/autocast_mode.cpp (torch 2.x):
- lower_precision_fp on CUDA and CPU: linear, matmul, mm, bmm, addmm, baddbmm (catalog "matmul") and
  scaled_dot_product_attention (catalog "attention"; HF's eager attention is matmuls too);
- fp32 on CUDA only: layer_norm, and softmax unless the call passes dtype= (fp32_set_opt_dtype);
  CPU autocast leaves both in the input dtype (checked: F.softmax(x16) stays float16 there);
- everything else, rms_norm and rope included, runs in its inputs' dtype.
float64 (and non-float) inputs are never autocast. Our Triton kernels (variant "triton") are Python
functions that launch their own kernels: autocast does not touch them, so callers skip them.
"""

from __future__ import annotations

import contextlib

import torch

LOWER_PRECISION = frozenset({"matmul", "attention"})
FP32 = {"cuda": frozenset({"softmax", "layernorm"})}
AFFECTED = LOWER_PRECISION | FP32["cuda"]  # the ops whose dtype autocast can change, on any device
_ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)

# One C call, ~0.2 us: callers test it first so a call outside autocast pays nothing more.
enabled = torch._C._is_any_autocast_enabled


def call_dtype(op: str, x: torch.Tensor, asked: torch.dtype | None = None) -> torch.dtype:
    """The dtype catalog op `op` computes in for input x (its first tensor) under the current
    autocast state; `asked` is the call's own dtype= argument (softmax), which autocast respects."""
    if asked is not None:
        return asked
    dt = x.dtype
    if dt not in _ELIGIBLE:
        return dt
    dev = x.device.type
    if not torch.is_autocast_enabled(dev):
        return dt
    if op in LOWER_PRECISION:
        return torch.get_autocast_dtype(dev)
    if op in FP32.get(dev, ()):
        return torch.float32
    return dt


def off(device_type: str | None) -> contextlib.AbstractContextManager:
    """A context with autocast off on this device where it is on (else nothing): our own float32/float64 maths
    (sketches, the float32 fallback) must not be cast down by the caller's autocast."""
    if device_type is not None and enabled() and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()
