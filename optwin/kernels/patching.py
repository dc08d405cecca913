"""Swap a Hugging Face model's norms, attention softmax and rotary application for our Triton kernels.

    TRITON_INTERPRET=1 python -m pytest -q tests/test_kernels_patch.py

Like Liger-Kernel's model patches: RMSNorm modules (any class named *RMSNorm with `weight` and
`variance_epsilon`/`eps`, e.g. LlamaRMSNorm) and torch.nn.LayerNorm instances get an instance-level
`forward`; the model's modeling module gets our `apply_rotary_pos_emb` and `eager_attention_forward`
(the softmax lives there; it runs when the model uses attn_implementation="eager"). Everything is
undone by the returned handle (`handle.undo()`, or use it as a context manager). `handle.calls`
counts kernel launches per op, so a caller can see that the swap took effect.

The kernels launch without their sketch unless a monitor is running (optwin.kernels.sketch_sink):
then each call asks it whether to sketch (its per-stream sampling) and hands it the fused buffer,
and the monitor computes no sketch of its own for the call. `handle.sketched` counts those launches.
Either order works when the two unwind in reverse (nested `with`): a patch applied under a running
monitor replaces the monitor's rotary and attention wrappers (the attention "math" record goes with
them; the softmax inside is monitored as softmax/triton), and a patch applied first is wrapped by it.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch import nn

from optwin.kernels import sketch_sink
from optwin.kernels._common import DTYPES
from optwin.kernels.layernorm import layernorm
from optwin.kernels.rmsnorm import rmsnorm
from optwin.kernels.rope import rope_from_tables
from optwin.kernels.softmax import softmax


@dataclass
class Patch:
    """Undo handle: restores every swapped forward and module global, in reverse order."""

    calls: Counter = field(default_factory=Counter)
    sketched: Counter = field(default_factory=Counter)  # launches with the fused sketch (a monitor's samples)
    _undo: list[Callable[[], None]] = field(default_factory=list)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def _set_forward(handle: Patch, module: nn.Module, fwd: Callable[..., Any]) -> None:
    had = "forward" in module.__dict__
    old = module.__dict__.get("forward")
    module.forward = fwd  # instance attribute shadows the class's forward

    def restore() -> None:
        if had:
            module.forward = old
        else:
            del module.forward

    handle._undo.append(restore)


def _set_fused(handle: Patch, module: nn.Module, op: str, fwd: Callable[..., Any]) -> None:
    """_set_forward, and list the module in sketch_sink.FUSED (it runs op's `triton` variant) until undo."""
    _set_forward(handle, module, fwd)
    sketch_sink.FUSED[module] = op
    handle._undo.append(lambda: sketch_sink.FUSED.pop(module, None))


def _set_global(handle: Patch, mod: ModuleType, name: str, value: Any) -> None:
    old = getattr(mod, name)
    setattr(mod, name, value)
    handle._undo.append(lambda: setattr(mod, name, old))


def _launch(handle: Patch, op: str, dtype: torch.dtype, run: Callable[[bool], tuple[torch.Tensor, Any]],
            suffix: str = "", variant: str = "triton") -> torch.Tensor:
    """run(sketch) -> (y, buffer): with the sketch only when the active monitor samples this call,
    whose buffer then goes to it."""
    handle.calls[op] += 1
    sink = sketch_sink.active()
    token = sink.wants(op, variant, dtype, suffix) if sink is not None else None
    y, buf = run(token is not None)
    if token is not None:
        handle.sketched[op] += 1
        sink.take(token, buf)
    return y


def _rmsnorm_forward(handle: Patch, m: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    eps = float(getattr(m, "variance_epsilon", getattr(m, "eps", 1e-6)))

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dtype not in DTYPES:  # float64 models keep their own code (the kernels are fp32 inside)
            return type(m).forward(m, hidden_states)
        w = m.weight
        y = _launch(handle, "rmsnorm", hidden_states.dtype,
                    lambda sk: rmsnorm(hidden_states, w.to(hidden_states.dtype), eps, sketch=sk))
        return y.to(torch.promote_types(hidden_states.dtype, w.dtype))  # HF: weight * h.to(input dtype)

    return forward


def _layernorm_forward(handle: Patch, m: nn.LayerNorm) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in DTYPES:
            return type(m).forward(m, x)
        bias = m.bias.to(x.dtype) if m.bias is not None else None  # nn.LayerNorm(bias=False)
        # defer: where the launch runs a program per row (hidden sizes of the Welford launch), its finisher runs
        # batched with other calls' when the monitor settles them (optwin.kernels.deferred)
        return _launch(handle, "layernorm", x.dtype,
                       lambda sk: layernorm(x, m.weight.to(x.dtype), bias, float(m.eps), sketch=sk, defer=True))

    return forward


def _rotary(handle: Patch, original: Callable[..., Any]) -> Callable[..., Any]:
    def apply_rotary_pos_emb(q, k, cos, sin, *args: Any, **kwargs: Any):  # HF signature
        unsqueeze_dim = kwargs.get("unsqueeze_dim", args[-1] if args else 1)
        if (unsqueeze_dim != 1 or cos.ndim != 3 or q.ndim != 4 or q.dtype not in DTYPES
                or cos.shape[-1] != q.shape[-1]):  # not the kernel's (partial rotary: the model's own code)
            return original(q, k, cos, sin, *args, **kwargs)
        # variant: HF's tables are fp32 angles cast to dtype, rope's fault driver; only the final
        # combine differs (fp32, one rounding, where HF rounds each product): fp32-angles, as capture names it
        return tuple(_launch(handle, "rope", x.dtype, lambda sk, x=x: rope_from_tables(x, cos, sin, sketch=sk), name,
                             variant="fp32-angles")
                     for name, x in (("q", q), ("k", k)))

    setattr(apply_rotary_pos_emb, sketch_sink.FUSED_ATTR, "rope")
    return apply_rotary_pos_emb


def _eager_attention(handle: Patch, mod: ModuleType) -> Callable[..., Any]:
    """HF's eager_attention_forward (transformers 5.x) with our softmax in place of F.softmax."""
    repeat_kv = mod.repeat_kv
    original = mod.eager_attention_forward

    def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        if query.dtype not in DTYPES:
            return original(module, query, key, value, attention_mask, scaling, dropout=dropout, **kwargs)
        key_states = repeat_kv(key, module.num_key_value_groups)  # (B, H, S, D)
        value_states = repeat_kv(value, module.num_key_value_groups)  # (B, H, S, D)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling  # (B, H, Sq, Sk)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        # HF: softmax(..., dtype=float32).to(query.dtype): fp32 out, as our kernel's out_dtype
        scores = attn_weights
        # defer: where the launch runs a program per row (long rows), its finisher runs batched with other
        # calls' when the monitor settles them (optwin.kernels.deferred)
        run = lambda sk: softmax(scores, sketch=sk, out_dtype=torch.float32, defer=True)  # noqa: E731
        attn_weights = _launch(handle, "softmax", scores.dtype, run).to(query.dtype)
        attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
        attn_output = torch.matmul(attn_weights, value_states)  # (B, H, Sq, D)
        return attn_output.transpose(1, 2).contiguous(), attn_weights

    return eager_attention_forward


def patch(model: nn.Module, rmsnorm: bool = True, layernorm: bool = True, softmax: bool = True,
          rope: bool = True) -> Patch:
    """Swap the model's operators for our kernels; returns the undo handle."""
    handle = Patch()
    modeling: dict[str, ModuleType] = {}
    for m in model.modules():
        mod = sys.modules.get(type(m).__module__)
        if mod is not None and mod.__name__.startswith("transformers.models."):
            modeling[mod.__name__] = mod
        if rmsnorm and type(m).__name__.endswith("RMSNorm") and isinstance(getattr(m, "weight", None), torch.Tensor):
            _set_fused(handle, m, "rmsnorm", _rmsnorm_forward(handle, m))
        elif layernorm and isinstance(m, nn.LayerNorm) and m.weight is not None and len(m.normalized_shape) == 1:
            _set_fused(handle, m, "layernorm", _layernorm_forward(handle, m))
    for mod in modeling.values():
        if rope and callable(getattr(mod, "apply_rotary_pos_emb", None)):
            _set_global(handle, mod, "apply_rotary_pos_emb", _rotary(handle, mod.apply_rotary_pos_emb))
        if softmax and callable(getattr(mod, "eager_attention_forward", None)) and hasattr(mod, "repeat_kv"):
            _set_global(handle, mod, "eager_attention_forward", _eager_attention(handle, mod))
    return handle
