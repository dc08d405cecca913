"""Swap a Hugging Face model's norms, attention softmax and rotary application for our Triton kernels.

    TRITON_INTERPRET=1 python -m pytest -q tests/test_kernels_patch.py

Like Liger-Kernel's model patches: RMSNorm modules (any class named *RMSNorm with `weight` and
`variance_epsilon`/`eps`, e.g. LlamaRMSNorm) and torch.nn.LayerNorm instances get an instance-level
`forward`; the model's modeling module gets our `apply_rotary_pos_emb` and `eager_attention_forward`
(the softmax lives there; it runs when the model uses attn_implementation="eager"). Everything is
undone by the returned handle (`handle.undo()`, or use it as a context manager). `handle.calls`
counts kernel launches per op, so a caller can see that the swap took effect.

Only what computes Llama's maths is swapped, checked when patching: an *RMSNorm module or a LayerNorm subclass
must give what the kernel computes on a float32 probe (GemmaRMSNorm's x * (1 + w) does not, and keeps its own
forward); a modeling module's apply_rotary_pos_emb must rotate a probe as rotate_half does (interleaved or
sectioned rotaries keep theirs); its eager_attention_forward must have Llama's signature and compute Llama's
attention on probes (Gemma2's softcap, or sinks passed or read from the module, keep theirs). Calls the kernels cannot take run the model's own code: float64 inputs, and tensors off CUDA
(a CPU model, CPU-offloaded layers; CPU is taken under TRITON_INTERPRET=1). The kernels have no backward: a call
that needs gradients (grad enabled and an input or weight that requires grad) runs the model's own code, so run
inference under torch.no_grad() or torch.inference_mode() to use them. Module globals are shared by every model of that modeling module: while a
patch holds, other models of the same family run the kernels too. A module or global already patched by a live
handle is left to it (a second patch of one model is empty), so undoing in any order restores the original.

The kernels launch without their sketch unless a monitor is running (optwin.kernels.sketch_sink):
then each call asks it whether to sketch (its per-stream sampling) and hands it the fused buffer,
and the monitor computes no sketch of its own for the call. `handle.sketched` counts those launches.
Either order works when the two unwind in reverse (nested `with`): a patch applied under a running
monitor replaces the monitor's rotary and attention wrappers (the attention "math" record goes with
them; the softmax inside is monitored as softmax/triton), and a patch applied first is wrapped by it (the
wrapper leaves the calls our kernels run to their own records: softmax/triton for the attention, not
attention "math" as well). A capture, or a "fallback"/"raise" monitor, wrapping a patch applied first records
each attention call our softmax runs as softmax/triton too, from the scores the patched function hands it
(optwin.ingest.capture.eager_scores), before the kernel runs.
They may unwind in any order too: undone under a monitor that wrapped its functions, the patch leaves
the wrapper in place (those functions then run the model's code, which the monitor watches as without a
patch), and undone after such a monitor stopped, it puts back transformers' own functions.
Under a monitor whose policy acts before the call (fallback, raise) or under capture, the patch leaves
their rotary and attention wrappers in place (those calls run the model's code, watched), so nothing they
watch goes unseen.
"""

from __future__ import annotations

import inspect
import os
import reprlib
import sys
import types
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch import nn

from optwin.errors import InputError
from optwin.ingest import intercept
from optwin.ingest.capture import _SHARED_LOCK, eager_scores, unwrap_idle, wrapper_state
from optwin.kernels import sketch_sink
from optwin.kernels._common import DTYPES
from optwin.kernels.layernorm import layernorm
from optwin.kernels.production import rmsnorm_fp32_acc, rotate_half
from optwin.kernels.rmsnorm import rmsnorm
from optwin.kernels.rope import rope_from_tables
from optwin.kernels.softmax import softmax


@dataclass
class Patch:
    """Undo handle: restores every swapped forward and module global, in reverse order."""

    calls: Counter = field(default_factory=Counter)
    sketched: Counter = field(default_factory=Counter)  # launches with the fused sketch (a monitor's samples)
    _undo: list[Callable[[], None]] = field(default_factory=list)
    # False once undone: a patched function that something still calls (a running monitor's wrapper of it,
    # see _set_global) then runs the code it replaced
    _live: bool = True

    def undo(self) -> None:
        self._live = False
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


# the attributes of each patched object (a module, a modeling module) that a live handle holds: a second patch
# leaves them alone. Weak keys: an entry goes with its object, where keying by id() let a freed model's entry
# (a patch never undone) claim a new object that reused the id, leaving it unpatched.
_HELD: weakref.WeakKeyDictionary[object, set[str]] = weakref.WeakKeyDictionary()


def _hold(handle: Patch, obj: object, name: str) -> bool:
    """Claim obj.name for `handle` until its undo; False when another live handle holds it."""
    names = _HELD.setdefault(obj, set())
    if name in names:
        return False
    names.add(name)
    handle._undo.append(lambda: names.discard(name))
    return True


def _needs_grad(*tensors: Any) -> bool:
    """The kernels have no backward: a call that autograd would record runs the model's own code."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _off_device(*tensors: Any) -> bool:
    """The kernels run on CUDA tensors, or on CPU ones under TRITON_INTERPRET=1 (tests): a call on another
    device (a CPU model, CPU-offloaded layers, meta tensors) runs the model's own code rather than failing.
    Read per call, as the kernels' check_device reads it."""
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    return any(isinstance(t, torch.Tensor) and not (t.device.type == "cuda" or (interpret and t.device.type == "cpu"))
               for t in tensors)


def _autocast(x: torch.Tensor) -> bool:
    """Under autocast the norms' dtypes are torch's to decide, per device: CUDA runs layer_norm (and rms_norm) in
    float32 and returns float32 for a bfloat16 input, where the kernel would return bfloat16; the model's own
    code gets autocast's answer on any device."""
    return torch.is_autocast_enabled(x.device.type)


@contextmanager
def _unwatched() -> Iterator[None]:
    """Run a probe past this thread's captures and monitors: their wrappers of torch.matmul, F.softmax,
    F.rms_norm ... would record the probe's calls as the model's (the wrappers run the original where the thread
    has no interceptor)."""
    stack = intercept._stack()
    saved = stack[:]
    stack.clear()
    try:
        yield
    finally:
        stack[:] = saved


def _computes(original: Callable[[], Any], reference: Callable[[], Any], rtol: float = 1e-3) -> bool:
    """Whether a module or function gives the kernel's maths on a probe (any error: it does not)."""
    try:
        # the probe's float32 input beside a half-precision weight makes torch's own norms warn of the mismatch:
        # the probe's business, not the caller's
        with torch.no_grad(), warnings.catch_warnings(), _unwatched():
            warnings.simplefilter("ignore")
            got, want = original(), reference()
            pairs = list(zip(got, want)) if isinstance(want, tuple) else [(got, want)]
            return all(torch.allclose(g.float(), r.float(), rtol=rtol, atol=rtol) for g, r in pairs)
    except Exception:  # noqa: BLE001  another signature, shape rule or dtype rule: not ours to replace
        return False


def _rms_eps(m: nn.Module) -> float | None:
    """The module's epsilon; None where torch picks it (torch.nn.RMSNorm(eps=None): float32's for our dtypes)."""
    eps = getattr(m, "variance_epsilon", getattr(m, "eps", 1e-6))
    return None if eps is None else float(eps)


def _rmsnorm_like(m: nn.Module) -> bool:
    w = getattr(m, "weight", None)
    if not (type(m).__name__.endswith("RMSNorm") and isinstance(w, torch.Tensor) and w.ndim == 1 and w.numel() > 0):
        return False
    x = torch.randn(3, w.numel(), generator=torch.Generator().manual_seed(0)).to(w.device)  # (3, hidden) float32
    eps = _rms_eps(m)
    # on a float32 probe the kernel's maths (float32 inside) is the fp32-acc variant's
    return _computes(lambda: type(m).forward(m, x),
                     lambda: rmsnorm_fp32_acc(x, w, torch.finfo(torch.float32).eps if eps is None else eps))


def _layernorm_like(m: nn.Module) -> bool:
    if not (isinstance(m, nn.LayerNorm) and m.weight is not None and len(m.normalized_shape) == 1):
        return False
    if type(m).forward is nn.LayerNorm.forward:
        return True
    x = torch.randn(3, m.normalized_shape[0], generator=torch.Generator().manual_seed(0)).to(m.weight.device)
    return _computes(lambda: type(m).forward(m, x),
                     lambda: nn.functional.layer_norm(x, m.normalized_shape, m.weight.float(),
                                                      None if m.bias is None else m.bias.float(), m.eps))


def _rotary_like(fn: Callable[..., Any]) -> bool:
    """fn(q, k, cos, sin) rotates as HF Llama's apply_rotary_pos_emb on (B, H, S, D) with (B, S, D) tables. A
    monitor's or capture's wrapper is probed through (__wrapped__): the probe must not be recorded as a call."""
    fn = inspect.unwrap(fn)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 3, 8, generator=g), torch.randn(1, 2, 3, 8, generator=g)  # (B, H, S, D)
    ang = torch.rand(1, 3, 4, generator=g) * 6.0
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()  # (B, S, D)
    c, s_ = cos[:, None], sin[:, None]
    return _computes(lambda: tuple(fn(q, k, cos, sin)),
                     lambda: (q * c + rotate_half(q) * s_, k * c + rotate_half(k) * s_))


# Llama's eager_attention_forward (transformers 5.x): a function with more parameters (Gemma2's softcap) computes
# more than the replacement does
_EAGER_PARAMS = ("module", "query", "key", "value", "attention_mask", "scaling", "dropout", "kwargs")
# keyword arguments that change the maths when set (attention sinks, logit soft-capping)
_EAGER_UNSUPPORTED = ("softcap", "sinks", "s_aux", "attn_logit_softcapping")


def _llama_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float,
                     groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF Llama's eager attention, op for op, as the replacement computes it around its softmax."""
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)  # repeat_kv: (B, H, S, D)
    w = torch.matmul(q, k.transpose(2, 3)) * scaling + mask  # (B, H, Sq, Sk)
    w = nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v).transpose(1, 2).contiguous(), w


def _eager_computes(fn: Callable[..., Any], groups: int | None) -> bool:
    """fn computes Llama's eager attention on a probe whose module has `groups` query heads per key/value head (None:
    a module without num_key_value_groups and as many key/value heads as query heads), in float32 (the maths, to a
    tolerance) and in bfloat16 (the same ops: bit for bit, so a softmax rounded otherwise fails)."""
    stub = nn.Module().eval()
    if groups is not None:
        stub.num_key_value_groups = groups
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 3, 8, generator=g)  # (B, H, S, D)
    k, v = (torch.randn(1, 4 // (groups or 1), 3, 8, generator=g) for _ in range(2))  # (B, H / groups, S, D)
    mask = torch.full((3, 3), torch.finfo(torch.float32).min).triu(1)[None, None]  # (1, 1, Sq, Sk): causal, HF's
    if not _computes(lambda: tuple(fn(stub, q, k, v, mask, 0.35, dropout=0.0)),
                     lambda: _llama_attention(q, k, v, mask, 0.35, groups or 1)):
        return False
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    mb = torch.full((3, 3), torch.finfo(torch.bfloat16).min, dtype=torch.bfloat16).triu(1)[None, None]
    try:
        with torch.no_grad(), _unwatched():
            got, want = fn(stub, qb, kb, vb, mb, 0.35, dropout=0.0), _llama_attention(qb, kb, vb, mb, 0.35, groups or 1)
        return all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    except Exception:  # noqa: BLE001  as _computes: not ours to replace
        return False


def _eager_like(fn: Callable[..., Any]) -> bool:
    """fn has Llama's signature and computes Llama's eager attention, probed on a grouped-query module (Llama's) or
    on one without num_key_value_groups (Idefics3's vision attention, which repeats nothing): the replacement
    repeats by getattr(module, "num_key_value_groups", 1). A module attribute fn reads beyond those and training
    (GPT-OSS's module.sinks), another softmax or another scaling rule fails the probes and keeps the model's code.
    A monitor's or capture's wrapper is probed through (__wrapped__): the probe must not be recorded as a call."""
    try:
        if tuple(inspect.signature(fn).parameters) != _EAGER_PARAMS:
            return False
    except (TypeError, ValueError):
        return False
    fn = inspect.unwrap(fn)
    return _eager_computes(fn, 2) or _eager_computes(fn, None)


def _watched_before_the_call(fn: Callable[..., Any]) -> bool:
    """fn is a capture's or a monitor's wrapper that must see each call's inputs before it runs (capture, and the
    monitor's fallback and raise policies, which take no fused sketch): replacing it would hide those calls."""
    return bool(getattr(fn, "__optwin_capture__", False)) and sketch_sink.active() is None


def _set_forward(handle: Patch, module: nn.Module, fwd: Callable[..., Any]) -> None:
    """module.forward = fwd(module, ...) until undo. Bound as a method, not a closure over the module: a deepcopy of
    the model rebinds it to the clone (copy's rule for methods), which fwd then runs with the clone's own code and
    parameters, and pickling (torch.save(model)) stores getattr(module, "forward"), the class's forward on load."""
    had = "forward" in module.__dict__
    old = module.__dict__.get("forward")
    module.forward = types.MethodType(fwd, module)  # instance attribute shadows the class's forward

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
    """mod.name = value until undo. The undo cannot just put back what it found: captures and monitors start
    and stop around the patch in any order, and their wrapper of the function is shared state
    (optwin.ingest.capture._Shared: `orig` what it calls and what its last user's stop puts back, `users`
    the starts still running). Setting back unconditionally overwrote a monitor started after the patch
    (it saw no rope or attention for the rest of its run), and put back a monitor's wrapper whose users had
    all stopped meanwhile (left installed for good, in place of transformers' function)."""
    with _SHARED_LOCK:  # as restore: a monitor starting in another thread wraps what it reads under this lock
        old = getattr(mod, name)
        setattr(mod, name, value)

    def restore() -> None:
        with _SHARED_LOCK:
            back = unwrap_idle(old)  # an idle wrapper: what it wraps
            cur = mod.__dict__.get(name)
            s = wrapper_state(cur)
            if cur is value or (s is not None and s.orig is value and not s.users):
                setattr(mod, name, back)
            elif s is not None and s.orig is value:
                # a running monitor or capture wrapped our function: its wrapper stays and our function, now
                # undone, passes its calls to `back` (the handle's flag); its stop puts `back` in place
                s.orig = back
            # else something else replaced ours meanwhile (a user's monkeypatch): theirs stays

    handle._undo.append(restore)


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


def _rmsnorm_takes(m: nn.Module, x: torch.Tensor) -> bool:
    """Whether the patched RMSNorm m runs the kernel on x, not the module's own forward (see kernel_runs)."""
    w = m.weight
    # float64 models keep their own code (the kernels are fp32 inside), and so do calls that need gradients,
    # whose tensors the kernels cannot reach, or that autocast decides (_autocast)
    if x.dtype not in DTYPES or _needs_grad(x, w) or _off_device(x, w) or _autocast(x):
        return False
    # a weight wider than the input (HF's float32 q/k norms under autocast, _keep_in_fp32_modules) multiplies
    # in its own precision: HF gives weight * h.to(input dtype) in float32, where the kernel would round the
    # weight and the product to the input dtype (up to 1 % off): the model's code keeps HF's result
    return torch.promote_types(x.dtype, w.dtype) == x.dtype


def _layernorm_takes(m: nn.Module, x: torch.Tensor) -> bool:
    """Whether the patched LayerNorm m runs the kernel on x, not the module's own forward (see kernel_runs)."""
    if x.dtype not in DTYPES or _needs_grad(x, m.weight, m.bias) or _off_device(x, m.weight, m.bias) or _autocast(x):
        return False
    # parameters in another dtype than the input (a LayerNorm kept in float32 under bfloat16 activations,
    # autocast over a float32 model) are torch's to handle, as rmsnorm's wider weight is HF's: CPU normalises
    # and applies the float32 affine in float32, CUDA refuses the mix (under CUDA autocast: float32 in and out),
    # where the kernel would round the weight and bias to the input dtype (an ulp off) or answer a refused call
    return m.weight.dtype == x.dtype and (m.bias is None or m.bias.dtype == x.dtype)


_TAKES = {"rmsnorm": _rmsnorm_takes, "layernorm": _layernorm_takes}


def kernel_runs(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether the patched norm `module`'s forward runs its kernel on input x; False where it runs the model's own
    code instead (float64, gradients, tensors off the kernels' device, parameters in another dtype) or where no
    patch holds the module. The patched forwards decide by the same tests, and so do the capture hooks
    (optwin.ingest.capture._call_kind), which must know before the call whether the kernel will sketch it: a
    module they took for patched left its call to a kernel that never ran, and a bfloat16 LayerNorm with float32
    weights went unrecorded under a monitor (and was recorded as the triton variant under a capture)."""
    takes = _TAKES.get(sketch_sink.fused_op(module) or "")
    return takes is not None and takes(module, x)


def _rmsnorm_forward(handle: Patch, m: nn.Module) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    eps_set = _rms_eps(m)

    def forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        if self is not m:  # a deepcopy of the patched module: the patch (and its undo) is the original's
            return type(self).forward(self, hidden_states)
        if not _rmsnorm_takes(m, hidden_states):  # the capture hooks' test too (kernel_runs)
            return type(m).forward(m, hidden_states)
        w = m.weight
        # torch.nn.RMSNorm(eps=None) takes the epsilon of its computation dtype, float32 for half-precision
        # inputs too (torch's _fused_rms_norm decomposition), not the input dtype's: bf16's 2**-7 would swamp
        # the mean square of small activations
        eps = torch.finfo(torch.float32).eps if eps_set is None else eps_set
        y = _launch(handle, "rmsnorm", hidden_states.dtype,
                    lambda sk: rmsnorm(hidden_states, w.to(hidden_states.dtype), eps, sketch=sk))  # w: exact
        return y  # the input's dtype, HF's weight * h.to(input dtype) with a weight no wider than h

    return forward


def _layernorm_forward(handle: Patch, m: nn.LayerNorm) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self is not m:  # a deepcopy of the patched module: the patch (and its undo) is the original's
            return type(self).forward(self, x)
        if not _layernorm_takes(m, x):  # the capture hooks' test too (kernel_runs)
            return type(m).forward(m, x)
        # defer: where the launch runs a program per row (hidden sizes of the Welford launch), its finisher runs
        # batched with other calls' when the monitor settles them (optwin.kernels.deferred)
        return _launch(handle, "layernorm", x.dtype,
                       lambda sk: layernorm(x, m.weight, m.bias, float(m.eps), sketch=sk, defer=True))  # None: bias=False

    return forward


# The attribute of a patched rotary or eager attention function that holds its test (rotary_runs, eager_runs).
_TAKES_ATTR = "_optwin_takes"


def rotary_runs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Whether the patched apply_rotary_pos_emb `fn` runs its kernel on these arguments; False where it runs the
    model's own code (an undone patch, unsqueeze_dim other than 1, partial rotary, float64, gradients, tensors
    off the kernels' device) or fn is not ours. The patched function decides by the same test, and so does a
    monitor's wrapper around it (optwin.ingest.capture._record_rope), which leaves the call's sketch to the
    kernel only when the kernel runs: left to it always, a call running the model's code went unmonitored."""
    takes = getattr(fn, _TAKES_ATTR, None)
    return takes is not None and takes(*args, **kwargs)


def eager_runs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Whether the patched eager_attention_forward `fn` runs our softmax on these arguments; False where it runs
    the model's own code (an undone patch, float64, scaling=None, gradients, tensors off the kernels' device,
    softcap or sinks) or fn is not ours. The patched function decides by the same test, and so does a capture's or
    monitor's wrapper around it (optwin.ingest.capture._record_eager_unfused), which then records the call as
    softmax/triton, not attention "math": by the kernel's fused sketch under a "warn" monitor (as rotary_runs does
    for rope), else from the scores the patched function hands over (optwin.ingest.capture.eager_scores)."""
    return rotary_runs(fn, *args, **kwargs)  # the same attribute: each patched function carries its own test


def _rotary(handle: Patch, original: Callable[..., Any]) -> Callable[..., Any]:
    def takes(q, k, cos, sin, *args: Any, **kwargs: Any) -> bool:  # the kernel's calls (see rotary_runs)
        unsqueeze_dim = kwargs.get("unsqueeze_dim", args[-1] if args else 1)
        return not (not handle._live or unsqueeze_dim != 1 or cos.ndim != 3 or q.ndim != 4 or q.dtype not in DTYPES
                    or cos.shape[-1] != q.shape[-1]  # not the kernel's (partial rotary: the model's own code)
                    or _needs_grad(q, k, cos, sin) or _off_device(q, k, cos, sin))

    def apply_rotary_pos_emb(q, k, cos, sin, *args: Any, **kwargs: Any):  # HF signature
        if not takes(q, k, cos, sin, *args, **kwargs):
            return original(q, k, cos, sin, *args, **kwargs)
        # variant: HF's tables are fp32 angles cast to dtype, rope's fault driver; only the final
        # combine differs (fp32, one rounding, where HF rounds each product): fp32-angles, as capture names it
        return tuple(_launch(handle, "rope", x.dtype, lambda sk, x=x: rope_from_tables(x, cos, sin, sketch=sk), name,
                             variant="fp32-angles")
                     for name, x in (("q", q), ("k", k)))

    # undone, it emits no sketch: a monitor's wrapper still calling it (_set_global) must sketch rope itself
    return _mark(handle, apply_rotary_pos_emb, "rope", takes)


def _mark(handle: Patch, fn: Callable[..., Any], op: str, takes: Callable[..., bool]) -> Callable[..., Any]:
    """fn, a patched module global, marked as our kernel of `op` (sketch_sink's fused marker: a monitor's wrapper
    around it leaves the sketch to the kernel) with `takes`, its test of the calls the kernel runs (rotary_runs,
    eager_runs). The patch's undo drops the marker: a wrapper still calling the undone function records the call
    itself."""
    setattr(fn, sketch_sink.FUSED_ATTR, op)
    setattr(fn, _TAKES_ATTR, takes)
    handle._undo.append(lambda: delattr(fn, sketch_sink.FUSED_ATTR))
    return fn


def _eager_attention(handle: Patch, mod: ModuleType) -> Callable[..., Any]:
    """HF's eager_attention_forward (transformers 5.x) with our softmax in place of F.softmax."""
    repeat_kv = mod.repeat_kv
    original = mod.eager_attention_forward

    def takes(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs) -> bool:  # see eager_runs
        # scaling=None: functions that default it (Evolla's) compute it themselves; ours multiplies by it
        return not (not handle._live or query.dtype not in DTYPES or scaling is None or _needs_grad(query, key, value)
                    or _off_device(query, key, value)
                    or any(kwargs.get(k) is not None for k in _EAGER_UNSUPPORTED))

    def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        if not takes(module, query, key, value, attention_mask, scaling, dropout, **kwargs):
            return original(module, query, key, value, attention_mask, scaling, dropout=dropout, **kwargs)
        # modules without grouped-query heads (Idefics2's vision attention) have no num_key_value_groups: the
        # functions that take them repeat nothing
        groups = getattr(module, "num_key_value_groups", 1)
        key_states = repeat_kv(key, groups)  # (B, H, S, D)
        value_states = repeat_kv(value, groups)  # (B, H, S, D)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling  # (B, H, Sq, Sk)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        # HF: softmax(..., dtype=float32).to(query.dtype): fp32 out, as our kernel's out_dtype
        scores = attn_weights
        # a capture's or a "raise"/"fallback" monitor's wrapper around this function queued the call: it records the
        # softmax that runs, on the scores the kernel receives (a "warn" monitor takes the kernel's fused sketch)
        if eager_scores(query, scores) is None:
            # defer: where the launch runs a program per row (long rows), its finisher runs batched with other
            # calls' when the monitor settles them (optwin.kernels.deferred)
            run = lambda sk: softmax(scores, sketch=sk, out_dtype=torch.float32, defer=True)  # noqa: E731
            attn_weights = _launch(handle, "softmax", scores.dtype, run).to(query.dtype)
        else:
            # a "fallback" monitor predicted this softmax faults: it runs as the monitor's fallback runs a torch
            # call, in float32 (torch's softmax of the upcast scores), no kernel; float32 out, as the kernel's
            attn_weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
        attn_output = torch.matmul(attn_weights, value_states)  # (B, H, Sq, D)
        return attn_output.transpose(1, 2).contiguous(), attn_weights

    # A capture or monitor started after the patch wraps this function (capture._record_eager_unfused): on the calls
    # `takes`, the wrapper records no attention "math" (whose twin runs torch's softmax) but our softmax's
    # softmax/triton record (the fused sketch, or eager_scores above), so one call is one record of what ran
    # undone, it runs the model's code: a monitor's wrapper still calling it (_set_global) records attention again
    return _mark(handle, eager_attention_forward, "softmax", takes)


def patch(model: nn.Module, rmsnorm: bool = True, layernorm: bool = True, softmax: bool = True,
          rope: bool = True) -> Patch:
    """Swap the model's operators for our kernels; returns the undo handle."""
    if not isinstance(model, nn.Module):  # a name or a tensor would fail deep inside as a bare AttributeError
        shown = reprlib.repr(model).replace("\n", " ")  # one line, however long the object's repr
        raise InputError(f"patch takes a torch.nn.Module (the model), got {type(model).__name__}: {shown}")
    handle = Patch()
    modeling: dict[str, ModuleType] = {}
    for m in model.modules():
        mod = sys.modules.get(type(m).__module__)
        if mod is not None and mod.__name__.startswith("transformers.models."):
            modeling[mod.__name__] = mod
        if rmsnorm and _rmsnorm_like(m) and _hold(handle, m, "forward"):
            _set_fused(handle, m, "rmsnorm", _rmsnorm_forward(handle, m))
        elif layernorm and _layernorm_like(m) and _hold(handle, m, "forward"):
            _set_fused(handle, m, "layernorm", _layernorm_forward(handle, m))
    for mod in modeling.values():
        fn = getattr(mod, "apply_rotary_pos_emb", None)
        if (rope and callable(fn) and _rotary_like(fn) and not _watched_before_the_call(fn)
                and _hold(handle, mod, "apply_rotary_pos_emb")):
            _set_global(handle, mod, "apply_rotary_pos_emb", _rotary(handle, fn))
        fn = getattr(mod, "eager_attention_forward", None)
        if (softmax and callable(fn) and hasattr(mod, "repeat_kv") and _eager_like(fn) and not _watched_before_the_call(fn)
                and _hold(handle, mod, "eager_attention_forward")):
            _set_global(handle, mod, "eager_attention_forward", _eager_attention(handle, mod))
    return handle
