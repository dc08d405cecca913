"""Capture hooks: record catalog operator calls (and their sketches) as a real PyTorch model runs.

    python -c "from optwin.ingest.capture import capture; help(capture)"

    with capture(model, sample_rate=0.1, capacity=4) as rec:
        model(**batch)
    rec.write_profile("profiles/minilm", model="minilm")

Two interception paths, one per kind of call site:

* torch functions, wrapped for the capture's duration (optwin.ingest.intercept; calls in other
  threads pass through): `softmax` (F./torch./Tensor.) -> softmax "torch";
  `F.scaled_dot_product_attention` -> attention "sdpa"; `F.layer_norm` -> layernorm "torch";
  `F.rms_norm` -> rmsnorm "fp32-acc" (torch's fused kernel accumulates in fp32);
  `F.linear(x, W, b)` -> matmul "torch" with a = x.reshape(-1, in), b = W.T;
  `torch.matmul`/`@`/`mm` -> matmul "torch" when b is 2-D (a's leading dims folded into m;
  batched products of two >2-D tensors are not catalog matmuls and are skipped);
  `torch.addmm`/`Tensor.addmm` (transformers' Conv1D: GPT-2) -> matmul "torch" with a = mat1,
  b = mat2 when alpha is 1 and beta 0 or 1 (the bias add is not modelled: see _addmm).
* modules that optwin.kernels.patch swapped for our kernels -> their op's "triton" variant (rmsnorm,
  layernorm); under a monitor that takes fused sketches (optwin.kernels.sketch_sink) they, the
  patched rotary and the patched eager attention (whose softmax is recorded as softmax "triton"), record
  nothing here: the kernel hands the monitor its own sketch. Under a capture or a "raise"/"fallback"
  monitor, a patched eager attention call is recorded as softmax "triton" too, with the scores the
  patched function hands its kernel (eager_scores), not as attention "math". A call the patched
  forward leaves to the model's own code (kernel_runs in optwin.kernels.patching: a bfloat16 input with
  float32 weights, float64, gradients) is recorded as the unpatched module's.
* modules and functions whose *numerics* make them a variant, through module forward hooks and,
  where the tensors never cross a module boundary, by wrapping the transformers function for the
  duration of the capture: `*RMSNorm` / `T5LayerNorm` modules -> rmsnorm, variant by reading the
  class's forward source (an upcast to float32 -> "fp32-acc", none -> "native-dtype");
  `eager_attention_forward` (HF eager attention) -> attention "math" (q, k, v after repeat_kv);
  `apply_rotary_pos_emb` -> rope "fp32-angles" (HF builds cos/sin from fp32 angles).

nn.MultiheadAttention / nn.TransformerEncoderLayer: in eval without autograd (no_grad, inference_mode)
torch runs them through a fused C++ fast path that calls none of the functions above. A capture turns
that path off while it runs (torch.backends.mha.set_fastpath_enabled(False), process-wide, the previous
setting restored when the last capture stops), so they run their Python slow path and their F.linear,
sdpa and F.layer_norm calls are recorded: the capture records MHA's slow path, which computes the same
ops as the fast path but not with the same fused kernels. A monitor leaves the fast path on and counts
its calls in `skipped` (see _FASTPATH_CALLS).

Rope in transformers 5.x Llama: `LlamaRotaryEmbedding.forward(x, position_ids)` returns (cos, sin)
for all layers once per forward and never sees q/k; `apply_rotary_pos_emb(q, k, cos, sin)` sees q/k
but not the positions. So a forward hook on the rotary module remembers position_ids and the base
(config rope_theta), and the wrapped `apply_rotary_pos_emb` records two rope calls (streams
"<attention path>:q" and ":k") with x = q or k as [batch*seq, heads, d] and positions [batch*seq].

While a hooked module's forward or a wrapped function runs, the torch functions it calls are not
recorded again (no double counting: the eager softmax belongs to attention "math").

Threads and nesting: only the thread that entered the capture is recorded (module hooks and wrapped
transformers functions are process-wide, so they test the thread; their suppression and module stack
are per thread). Captures and monitors nest: each wrapped function feeds every one active in the
thread, except that a recorder with a model leaves out the calls inside another active recorder's
model and not inside its own (Recorder.foreign: two models, each under its own monitor).

Every record carries op, variant, dtype, stream (module path of the innermost module whose method
is running, e.g. "encoder.layer.3.attention.self": Recorder.stream), call_index (order of calls in this capture), t (seconds
since the capture began) and the sketch. Sketches stay tensors on the inputs' device until the
records are read (one sync per op at the end on CUDA). Raw inputs are kept by reservoir sampling
per (op, variant, dtype, shape class): each call is offered with probability sample_rate, and each
class keeps at most `capacity` uniformly chosen offered calls (cloned to CPU).

Memory: every recorded call is kept until the recorder is dropped, about 1.3 KB (its sketch as a
float64 tensor, the call's labels), and records() adds about 1.4 KB a call more (measured on the CPU,
20000 softmax calls): a long `generate` under capture (~10^6 calls) reaches gigabytes. `max_calls`
keeps the first max_calls calls and counts the rest in `skipped`; raw samples are bounded apart from
that by `capacity` per shape class.

Handlers only read inputs, then call the original function, so a captured call returns what it would
uncaptured, with one exception: while a capture runs, nn.MultiheadAttention / nn.TransformerEncoderLayer
in eval without autograd take their slow path (above), whose outputs may differ from the fast path's in
the last bits. The switch is process-wide: models in other threads run the slow path meanwhile too.
A call the sketch cannot take (unexpected shapes) is counted in `Recorder.skipped`, never raised; so
is a handler's own failure (an exception in a module hook, a wrapped function's or an intercepted
function's handler: "op: capture's handler failed in WHERE: Error", warned once per capture), after
which the model's own call runs as it would uncaptured. Only a monitor's FaultPredicted (policy
"raise") passes through on purpose.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import random
import re
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterator, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from optwin.catalog import CATALOG
from optwin.errors import CatalogError
from optwin.ingest import autocast_dtype, intercept
from optwin.ingest.intercept import Target, eager_under_compile
from optwin.ingest.sketch import SKETCH_FEATURES, WeightCache, sketch_tensor
from optwin.kernels import sketch_sink


@dataclass(frozen=True)
class CaptureSettings:
    """Sampling settings of one capture (they are written into profile.json)."""

    sample_rate: float = 0.0  # probability that a call is offered to its tensor reservoir
    capacity: int = 4  # raw calls kept per (op, variant, dtype, shape class)
    seed: int = 0  # reservoir randomness
    ops: tuple[str, ...] | None = None  # record only these ops (None: all)
    max_calls: int | None = None  # record the first max_calls calls, count the rest in skipped (None: all)


@dataclass
class Sample:
    """A raw call kept by the reservoir: CPU clones of its inputs."""

    op: str
    variant: str
    dtype: str
    stream: str
    call_index: int
    shape_class: str
    inputs: dict[str, torch.Tensor]
    params: dict[str, Any]


@dataclass
class _Pending:
    op: str
    variant: str
    dtype: str
    stream: str
    call_index: int
    t: float
    params: dict[str, Any]
    values: torch.Tensor  # float64 [n_features] on the inputs' device


# Shared by every capture in the process: entries are checked by identity and _version, so a
# changed or freed weight is never served stale statistics.
_WEIGHTS = WeightCache()


_DTYPE_NAMES: dict[torch.dtype, str] = {}


# A call's inputs by name, or a function making them (the views a handler would build on every call).
Inputs = dict[str, torch.Tensor] | Callable[[], dict[str, torch.Tensor]]


def _dtype_name(t: torch.Tensor) -> str:
    """'float16' for a float16 tensor (cached per dtype: the monitor asks on every call)."""
    name = _DTYPE_NAMES.get(t.dtype)
    if name is None:
        name = _DTYPE_NAMES[t.dtype] = str(t.dtype).removeprefix("torch.")
    return name


def _autocast_name(t: torch.Tensor, op: str) -> str:
    """The name of the dtype `op` computes in on input `t` (optwin.ingest.autocast_dtype): under
    torch.autocast not t's own. nn.Linear on float32 under autocast(float16) runs a float16 GEMM (it
    overflowed to inf) and was recorded as float32."""
    if not autocast_dtype.enabled():  # one C call: outside autocast nothing more
        return _dtype_name(t)
    return str(autocast_dtype.call_dtype(op, t)).removeprefix("torch.")


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def shape_class(op: str, inputs: dict[str, torch.Tensor]) -> str:
    """Inputs' shapes with every dim rounded up to a power of two: 'x=64x512,weight=512'."""
    return ",".join(f"{k}={'x'.join(str(_pow2(d)) for d in v.shape)}" for k, v in inputs.items())


class _PerThread(threading.local):
    """A recorder's per-thread state. Suppression and the stack of running hooked modules were shared by
    all threads: a second thread running the hooked model pushed and popped the same stack and counted
    into the same suppress, so the capturing thread's calls went unrecorded (and a monitor stayed blind
    once a race left suppress at 1). Each thread now has its own; only the owner's calls are recorded."""

    suppress = 0

    def __init__(self) -> None:
        self.stack: list[tuple[str, nn.Module, bool]] = []


class Recorder:
    """Collects the calls of one capture; read `records()`, `samples`, `skipped` after the block."""

    def __init__(self, settings: CaptureSettings) -> None:
        self.settings = settings
        self.samples: dict[str, list[Sample]] = {}
        self.skipped: Counter[str] = Counter()  # "op: reason" -> count
        self._offered: Counter[str] = Counter()
        self._pending: list[_Pending] = []
        self._rng = random.Random(settings.seed)
        # The thread that made the recorder (the one that entered the capture or started the monitor):
        # module hooks and wrapped functions record only its calls; other threads running the same
        # model pass through (see `_PerThread`).
        self.owner = threading.get_ident()
        self._local = _PerThread()
        self._paths: dict[int, str] = {}  # id(module) -> its path in the hooked model (see `stream`)
        self._t0 = time.perf_counter()
        self.started = time.time()
        self.last_positions: torch.Tensor | None = None
        self.last_base: float | None = None
        self.last_rope_reason: str | None = None  # why the last rotary call's tables are not the catalog's
        self._rope_checked: dict[Any, tuple[Any, ...]] = {}  # (id(rotary module), layer type) -> inv_freq verdict (_rope_reason)
        self._rope_tables_checked: dict[Any, tuple[Any, ...]] = {}  # the same key -> its cos/sin verdict (_table_reason)
        self._norm_weights: dict[int, tuple[Any, ...]] = {}  # id(norm module) -> (w, version, 1 + w) (_norm_weight)
        self._mask_seen: _MaskVerdict | None = None  # the last attention mask read (_mask_verdict)
        self._rope_pending: tuple[Any, str | None] | None = None  # the rotary call running (_keep_rope_table)
        self._rope_tables: dict[Any, tuple[Any, ...]] = {}  # its tables: (cos, positions, base, reason)
        self._records: list[dict[str, Any]] | None = None
        self._weights = _WEIGHTS  # weight statistics are reduced once, not on every call
        # True in a recorder that takes the fused sketches of patched kernels (optwin.monitor's, under
        # policy "warn"): their modules and functions then record nothing themselves
        self.takes_fused = False
        # How the call being recorded runs: a monitor's policy sets "fallback" (float32) while recording
        # it, its interceptor's `run` reads it; a capture leaves it None. Reset by every intercepted call.
        self.action: str | None = None
        self.handler_warned = False  # _handler_failed's one warning per recorder

    # -- context ------------------------------------------------------------------------------

    @property
    def suppress(self) -> int:
        """> 0 while this thread is inside a hooked module, a wrapped function or the recorder's own work."""
        return self._local.suppress

    @suppress.setter
    def suppress(self, n: int) -> None:
        self._local.suppress = n

    @property
    def _stack(self) -> list[tuple[str, nn.Module, bool]]:
        """This thread's hooked modules whose forward runs: (path, module, holds a suppress count)."""
        return self._local.stack

    def here(self) -> bool:
        """Whether the calling thread is the one this recorder records."""
        return threading.get_ident() == self.owner

    def watches(self, op: str) -> bool:
        """Whether calls of `op` are recorded (the capture's `ops`); for "a|b" (a fused torch call that
        runs several ops, see _fastpath), whether any of them is."""
        ops = self.settings.ops
        return ops is None or op in ops or ("|" in op and any(o in ops for o in op.split("|")))

    def skip(self, reason: str, n: int = 1) -> None:
        """Count `n` calls in `skipped` under "op: reason" (a monitor also counts them in its stats)."""
        self.skipped[reason] += n

    @property
    def stream(self) -> str:
        """The module path of the call being recorded: the hooked module whose forward runs (norms and
        rotary modules: leaves), else the innermost method frame whose `self` is a module of the model
        (a walk up the caller's frames: hooking every module cost more than the model on small inputs,
        bench/monitor_host.py), else ""."""
        stack = self._local.stack
        if stack:
            return stack[-1][0]
        if not self._paths:
            return ""
        m = self._frame_module(sys._getframe(1))
        return "" if m is None else self._paths[id(m)]

    def calling_module(self) -> nn.Module | None:
        """The innermost module of the hooked model whose method is running (the frame walk of
        `stream`), or None."""
        if not self._paths:
            return None
        return self._frame_module(sys._getframe(1))

    def _frame_module(self, f: FrameType | None) -> nn.Module | None:
        """The `self` of the innermost method frame, from `f` out through its callers, that is a module
        of the hooked model (in `_paths`), or None. `stream` and `calling_module` both walk from their
        own caller's frame."""
        paths = self._paths
        while f is not None:
            code = f.f_code
            # f_locals builds the frame's locals dict: not for the frames of the capture's own
            # machinery between the call and the model (the interceptor, the recorder, the monitor)
            if code.co_argcount and code.co_varnames[0] == "self" and code not in OWN_FRAMES:
                obj = f.f_locals["self"]
                if id(obj) in paths:
                    return obj
            f = f.f_back
        return None

    def foreign(self) -> bool:
        """Whether the call running now (a torch function, a wrapped transformers function or a patched kernel,
        which every recorder active in this thread is handed) is another model's: this recorder has a model
        and the call runs inside none of its modules, but inside the model of another recorder active in the
        thread. Two models each under its own monitor (nested) recorded each other's calls: the other
        model's matmul, attention, softmax, rope and patched norms landed in streams with no module path
        ("matmul", ":q:rope"), rope with this model's positions and base, and fed this model's forecasters and
        verdicts. A call inside no recorder's model (the user's own torch call in the block) is still every
        recorder's, as it was; a lone recorder, or one without a model, records everything as before (the
        first test: with one interceptor in the thread it costs a length check)."""
        here = getattr(intercept._LOCAL, "stack", None)
        if here is None or len(here) < 2 or not self._paths or self._local.stack:
            return False
        others = [r for r in _here_recorders() if r is not self and r._paths]
        if not others:
            return False
        f = sys._getframe(1)
        if self._frame_module(f) is not None:
            return False
        return any(r._local.stack or r._frame_module(f) is not None for r in others)

    @property
    def module(self) -> nn.Module | None:
        stack = self._local.stack
        return stack[-1][1] if stack else None

    # -- recording ----------------------------------------------------------------------------

    def record(self, op: str, variant: str, inputs: Inputs, params: dict[str, Any] | None = None,
               dtype: str | None = None, stream: str | None = None) -> None:
        """Sketch one call and keep it; never raises (a refused call is counted in `skipped`).
        `inputs` may be a function that makes them (with `dtype` given): a monitor makes them only
        for the calls its sampling keeps."""
        if not self.watches(op):
            return
        cap = self.settings.max_calls
        if cap is not None and len(self._pending) >= cap:  # before any work: a full capture costs a count
            self.skip(f"{op}: past max_calls={cap} (the capture keeps its first max_calls calls)")
            return
        if callable(inputs):
            inputs = inputs()
        params = params or {}
        on_cpu = all(t.device.type == "cpu" for t in inputs.values())
        threads = torch.get_num_threads() if on_cpu else 1
        try:
            # Our own reductions are not calls to record (suppress: the intercepted torch functions
            # pass them through). On CPU they run on one thread: they are small memory-bound passes,
            # and an OpenMP barrier per tiny reduction costs more than it saves (badly so on a loaded
            # machine, where a sibling thread may be descheduled). The setting is process-wide, so it
            # is restored at once.
            local = self._local
            local.suppress += 1
            if threads > 1:
                torch.set_num_threads(1)
            main = next(iter(inputs.values()))
            with autocast_dtype.off(main.device.type):  # the sketch's own maths stays float32/64
                _, values = sketch_tensor(op, inputs, params, cache=self._weights)
        except Exception as e:  # noqa: BLE001  a capture must never break the model it watches
            self.skip(f"{op}: {type(e).__name__}: {str(e)[:120]}")
            return
        finally:
            local.suppress -= 1
            if threads > 1:
                torch.set_num_threads(threads)
        p = _Pending(op, variant, dtype or _dtype_name(main), self.stream if stream is None else stream,
                     len(self._pending), time.perf_counter() - self._t0, dict(params), values)
        self._pending.append(p)
        self._records = None
        if self.settings.sample_rate > 0 and self._rng.random() < self.settings.sample_rate:
            self._offer(p, inputs)

    def _offer(self, p: _Pending, inputs: dict[str, torch.Tensor]) -> None:
        """Reservoir sampling (algorithm R) per (op, variant, dtype, shape class)."""
        sc = shape_class(p.op, inputs)
        key = f"{p.op}|{p.variant}|{p.dtype}|{sc}"
        self._offered[key] += 1
        box = self.samples.setdefault(key, [])
        cap = self.settings.capacity
        slot = len(box) if len(box) < cap else self._rng.randrange(self._offered[key])
        if slot >= cap:
            return
        kept = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in inputs.items()}
        s = Sample(p.op, p.variant, p.dtype, p.stream, p.call_index, sc, kept, dict(p.params))
        if slot == len(box):
            box.append(s)
        else:
            box[slot] = s

    def records(self) -> list[dict[str, Any]]:
        """One dict per call: op, variant, dtype, stream, call_index, t, params, sketch (one sync per op)."""
        if self._records is None:
            by_op: dict[str, list[int]] = {}
            for i, p in enumerate(self._pending):
                by_op.setdefault(p.op, []).append(i)
            sketches: list[dict[str, float] | None] = [None] * len(self._pending)
            for op, idx in by_op.items():
                names = SKETCH_FEATURES[op]
                rows = torch.stack([self._pending[i].values.to("cpu") for i in idx]).tolist()
                for i, row in zip(idx, rows):
                    sketches[i] = dict(zip(names, row))
            self._records = [
                {"op": p.op, "variant": p.variant, "dtype": p.dtype, "stream": p.stream, "call_index": p.call_index,
                 "t": p.t, "params": p.params, "sketch": sketches[i]}
                for i, p in enumerate(self._pending)
            ]
        return self._records

    def all_samples(self) -> list[Sample]:
        return sorted((s for box in self.samples.values() for s in box), key=lambda s: s.call_index)

    def write_profile(self, path: str | Path, model: str = "", extra: dict[str, Any] | None = None) -> Path:
        """Write this capture as a profile directory (see optwin.ingest.profile)."""
        from optwin.ingest.profile import write_profile

        return write_profile(path, self, model=model, extra=extra)


# ----------------------------------------------------------------------------- torch functions


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _softmax(rec: Recorder, args: tuple, kwargs: dict) -> None:
    x = _arg(args, kwargs, 0, "input")
    dim = _arg(args, kwargs, 1, "dim")
    dtype = kwargs.get("dtype") if len(args) < 3 or not isinstance(args[2], torch.dtype) else args[2]
    if not isinstance(x, torch.Tensor) or x.ndim == 0:
        return
    if dim is not None and dim not in (-1, x.ndim - 1):
        x = x.movedim(dim, -1)  # the catalog softmax runs over the last dim
    # softmax(x, dtype=float32) computes in float32: that is the call's dtype.
    rec.record("softmax", "torch", {"x": x},
               dtype=str(dtype).removeprefix("torch.") if dtype is not None else _autocast_name(x, "softmax"))


log = logging.getLogger("optwin.ingest.capture")
_SCALE_WARNED = False  # the one-time warning of _default_scale


def _handler_failed(rec: Recorder, op: str, where: str, e: Exception, site: str = "") -> None:
    """Count a capture handler's own failure (a bug, or a call it cannot digest) in `skipped` under
    "op: capture's handler failed in WHERE: Error" and warn once per recorder (naming `site`, a module
    path, which stays out of the key: one key per module would flood profile.json); the caller then
    lets the model's call run as it would uncaptured. The wrapped transformers functions and the module
    hooks let such errors out, and a capture broke the forward of the model it watched."""
    rec.skip(f"{op}: capture's handler failed in {where}: {type(e).__name__}")
    if not rec.handler_warned:
        rec.handler_warned = True
        log.warning("optwin: a capture handler failed in %s%s (%s: %s); the call ran uncaptured and is counted in "
                    "skipped (further failures are counted, not warned)", where, f" of {site}" if site else "",
                    type(e).__name__, str(e)[:200])


def _guarded(rec: Recorder, op: str, where: str, handler: Callable[..., None], *args: Any, site: str = "") -> None:
    """handler(*args) for a hook or wrapped function outside the interceptor: its failure counted
    (_handler_failed), never raised into the model, except what `rec`'s interceptor passes (_passes)."""
    try:
        handler(*args)
    except Exception as e:  # noqa: BLE001  never break the model (a monitor's FaultPredicted passes)
        if isinstance(e, _passes(rec)):
            raise
        _handler_failed(rec, op, where, e, site)


def _passes(rec: Recorder) -> tuple[type[BaseException], ...]:
    """The handler errors that propagate for `rec` (its interceptor's `passes`: a monitor's
    FaultPredicted under policy "raise"), for the handlers outside the interceptor: module hooks and
    wrapped functions. Looked up only once a handler has raised."""
    for i in intercept.current():
        if getattr(i, "rec", None) is rec:
            return i.passes
    return ()


def _default_scale(rec: Recorder, scale: Any, d: int) -> bool:
    """Whether an attention call's softmax scale is the catalog's 1/sqrt(d); a call with another is
    counted in `skipped` (and warned about once per process), not recorded. The catalog's attention has
    no scale param: the sketch and every twin scale the scores by 1/sqrt(d), so a call sketched that way
    described other scores (sdpa scale=1.0 at d = 64: peaked_frac 0.0 where 45 % of its rows are peaked)
    and was looked up in the fingerprints of another call. A sketch-only param would not help: the twins
    would replay such cases at 1/sqrt(d), so the fingerprints stay honest only while the catalog has none."""
    if scale is None or (isinstance(scale, (int, float)) and math.isclose(scale, 1.0 / math.sqrt(max(d, 1)), rel_tol=1e-6)):
        return True
    rec.skip("attention: softmax scale other than 1/sqrt(d) (not a catalog param)")
    global _SCALE_WARNED
    if not _SCALE_WARNED:
        _SCALE_WARNED = True
        log.warning("optwin: attention calls with a softmax scale other than 1/sqrt(d) (here %r at d=%d) are not "
                    "recorded: the catalog's attention has no scale param", scale, d)
    return False


def _sdpa(rec: Recorder, args: tuple, kwargs: dict) -> None:
    q, k, v = (_arg(args, kwargs, i, n) for i, n in enumerate(("query", "key", "value")))
    mask = _arg(args, kwargs, 3, "attn_mask")
    is_causal = bool(_arg(args, kwargs, 5, "is_causal", False))
    if q.ndim != 4:
        rec.skip(f"attention: sdpa with {q.ndim}-D q")
        return
    if not _default_scale(rec, kwargs.get("scale"), q.shape[-1]):  # keyword-only in sdpa
        return
    if is_causal:  # torch's mask, top-left even for one query row (it sees key 0 only)
        n, causal, spans, rows = None, True, None, True
    else:
        # HF passes is_causal=True without padding and, with padding, is_causal=False and an explicit mask; the
        # attention module is not hooked (a padded batch was recorded as non-causal), so the model's module is
        # found by the stream's frame walk, only where the mask leaves it to decide
        form = _mask_form(rec, mask, q.shape[2], k.shape[2], lambda: getattr(rec.calling_module(), "is_causal", False))
        if form is None:
            return
        n, causal, spans, rows = form
    dtype = _autocast_name(q, "attention")
    for q, k, v in _attention_parts(q, k, v, n, spans, rows):  # GQA: kv heads expanded (norms unchanged)
        rec.record("attention", "sdpa", _attention_inputs(q, k, v), {"causal": causal}, dtype=dtype)


# A cached multi-token step (generate fed several new tokens, chunked prefill, speculative decoding's
# verify): HF masks query i to keys j <= seq_k - seq_q + i, bottom-right aligned. The catalog's causal
# flag is top-left (sdpa's is_causal: query i sees keys j <= i, optwin.twin.attention) and its attention
# takes no mask, so no recorded case replays that call: recorded non-causal, its twin let every query see
# every key (row 0 of a 3-token step on 8 cached tokens saw 11 keys where the model's saw 9), and causal
# would let it see one. Such calls are skipped and counted under this reason.
BOTTOM_RIGHT_SKIP = ("attention: cached multi-token step (causal mask bottom-right aligned, seq_q < seq_k): the "
                     "catalog's causal is top-left and takes no mask")

# A causal module's mask that is neither causal over a prefix of the keys (_mask_verdict) nor causal with padded
# keys masked (its verdict's other): a sliding window (Qwen2, Mistral: row 11 of a 4-wide window sees keys 8..11), an
# additive bias. It was recorded as the plain causal mask over every key (the twin's output 0.2 off the model's
# on a sliding-window prefill); the catalog's attention takes no mask, so such calls are skipped and counted.
# Padding is recorded per batch row over its live keys (_attention_parts), or skipped (PADDING_HOLES_SKIP).
# A module that is not causal (an encoder: BERT) has no skip here: its mask, when not bidirectional plus padding
# (its verdict's bidir), is still recorded non-causal over every key.
MASK_SKIP = "attention: mask not causal-only: sliding window / bias (the catalog's attention takes no mask)"

# A padded batch's mask: causal (or, one mask row for every query row, every key; or, an encoder's, every key for
# every live token's query row) with the keys that no query row of a batch row sees masked (_mask_verdict). Each batch
# row whose live keys are one span (left padding: a suffix, right padding: a prefix, no padding: every key) is
# recorded as what it computed, its rows sliced to that span (_attention_parts). A batch row whose live keys have a
# hole (a right-padded batch's decode step: its pad keys between the prompt and the new token; a pad token inside an
# encoder's row) computed what no catalog call replays: such calls are skipped, counted here.
PADDING_HOLES_SKIP = ("attention: padding mask whose live keys are not one span per batch row (holes): the "
                      "catalog's attention takes no mask")


def _bottom_right(seq_q: int, seq_k: int) -> bool | None:
    """The catalog's causal flag for attention masked causally bottom-right aligned (query i sees keys
    j <= seq_k - seq_q + i): one query sees every key (False), as many queries as keys is the top-left
    mask (True), and anything between has no catalog form (None: skip it, BOTTOM_RIGHT_SKIP)."""
    if seq_q <= 1:
        return False
    return True if seq_q == seq_k else None


def _mask_form(rec: Recorder, mask: Any, seq_q: int, seq_k: int, module_causal: Callable[[], bool],
               ) -> tuple[int | None, bool, tuple[tuple[int, int], ...] | None, bool] | None:
    """(used keys or None for all, the catalog's causal flag, each mask batch row's live key span (s, e) or None
    for every key of every row, whether the spans slice the query rows too: _attention_parts' rows) of an HF
    attention call (sdpa's without is_causal, eager's) from its mask, or None
    when the call has no catalog form, counted in skipped. The flag is top-left
    (query i sees keys j <= i); a causal module's mask is bottom-right aligned (_bottom_right): the top-left
    flag only when seq_q == seq_k, no form for a cached multi-token step (BOTTOM_RIGHT_SKIP). One mask row
    for every query row (HF's pack_gqa decode step: q (b, kv_heads, n_rep, d), its n_rep rows one token's
    heads) lets every row see the same keys: non-causal (as a bottom-right mask, every GQA decode step with a
    mask was skipped). No mask, or a module that is not causal (`module_causal()`, read only when the mask
    leaves it to decide: it can cost a frame walk), is non-causal. sdpa and eager attention decided this
    apart; eager's copy called a mask-less causal module's call causal, where eager attention applies no
    mask. A padded batch's mask (causal plus padding, see PADDING_HOLES_SKIP) gives the spans: recorded as one
    causal call over every key, its left-padded rows were replayed seeing pad keys the model's never saw. So does
    an encoder's (a module that is not causal, seq_q == seq_k: BERT, MiniLM) padded batch, bidirectional plus
    padding: recorded as one non-causal call over every key, every row's queries were replayed seeing its pad keys,
    which the model's never saw."""
    verdict = _mask_verdict(rec, mask, seq_q, seq_k)
    n = verdict.used
    shared = isinstance(mask, torch.Tensor) and mask.ndim == 4 and mask.shape[-2] == 1
    module_causal = functools.cache(module_causal)  # read at most once per call (sdpa's: a frame walk), only where needed
    if n is not None:  # causal over the used keys (top-left when seq_q == n)
        causal = False if shared else _bottom_right(seq_q, n)
    elif verdict.other and module_causal():
        rec.skip(MASK_SKIP)  # a sliding window, a bias: no catalog form
        return None
    elif mask is None or shared or not 1 < seq_q <= seq_k or not module_causal():
        causal = False
    else:
        causal = _bottom_right(seq_q, verdict.keys)
    if causal is None:
        rec.skip(BOTTOM_RIGHT_SKIP)
        return None
    spans = None
    # causal: seq_q == seq_k; shared: every query row sees the same keys; bidirectional (reached only for a module
    # that is not causal: a causal one's is MASK_SKIP): every live token's query row sees its batch row's live keys
    if n is None and (causal or shared or verdict.bidir):
        # causal plus padding (not other) or bidirectional plus padding: each batch row's live key span
        spans = verdict.spans if not verdict.other or verdict.bidir else None
        if spans == ():
            rec.skip(PADDING_HOLES_SKIP)
            return None
        if spans is not None and all(s == 0 and e == seq_k for s, e in spans):
            spans = None  # nothing padded
    # query row i is token i (a prefill, an encoder's self-attention) unless a one-mask-row step's rows are one token
    # (a decode step; a packed GQA decode step's n_rep rows are one token's heads, whatever seq_k is): the module says
    # which, read only for a padded shared mask with as many rows as keys
    rows = causal or (spans is not None and seq_q == seq_k > 1 and not module_causal())
    return n, causal, spans, rows


def _attention_parts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int | None,
                     spans: tuple[tuple[int, int], ...] | None,
                     rows: bool) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The catalog calls (q, k, v) that an attention call with _mask_form's (n, causal, spans, rows) computed: itself
    over its first n keys (a static cache's written slots), or, for a padded batch, one call per run of adjacent
    batch rows with the same live key span [s, e): keys and values [b:c, :, s:e]; queries [b:c, :, s:e] with `rows`
    (query i is token i: a causal prefill, query s + i sees keys s..s+i, top-left over the span; an encoder's
    non-causal self-attention, every live query over the span), the pad tokens' own query rows dropped: a decoder's
    output leaves them unused and an encoder's pooling ignores them (mean pooling weighs them 0, CLS pooling reads
    token 0), whatever the model put there; every query row without (a decode step: its one token over the live
    keys; cross-attention, seq_q != seq_k: every decoder query over the encoder's live keys). Views: no copies, so each run is one call and rows with the same span elsewhere in the batch
    another."""
    if n is not None:
        return [(q, k[:, :, :n], v[:, :, :n])]
    if spans is None:
        return [(q, k, v)]
    if len(spans) == 1:  # one mask batch row broadcast over the batch
        spans = spans * q.shape[0]
    parts, b = [], 0
    while b < len(spans):
        c = b + 1
        while c < len(spans) and spans[c] == spans[b]:
            c += 1
        s, e = spans[b]
        parts.append((q[b:c, :, s:e] if rows else q[b:c], k[b:c, :, s:e], v[b:c, :, s:e]))  # (c-b, h, *, d)
        b = c
    return parts


def _vec(t: torch.Tensor | None, n: int, like: torch.Tensor, fill: float) -> torch.Tensor:
    return t if isinstance(t, torch.Tensor) else torch.full((n,), fill, dtype=like.dtype, device=like.device)


def _rmsnorm_inputs(x: torch.Tensor, weight: torch.Tensor | None) -> dict[str, torch.Tensor]:
    return {"x": x, "weight": _vec(weight, x.shape[-1], x, 1.0)}


def _layernorm_inputs(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> dict[str, torch.Tensor]:
    h = x.shape[-1]
    return {"x": x, "weight": _vec(weight, h, x, 1.0), "bias": _vec(bias, h, x, 0.0)}


def _layer_norm(rec: Recorder, args: tuple, kwargs: dict) -> None:
    x = _arg(args, kwargs, 0, "input")
    shape = _arg(args, kwargs, 1, "normalized_shape")
    if len(tuple(shape)) != 1:
        rec.skip("layernorm: normalized over more than the last dim")
        return
    rec.record("layernorm", "torch", _layernorm_inputs(x, _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias")),
               dtype=_autocast_name(x, "layernorm"))


def _rms_norm(rec: Recorder, args: tuple, kwargs: dict) -> None:
    x = _arg(args, kwargs, 0, "input")
    shape = _arg(args, kwargs, 1, "normalized_shape")
    if len(tuple(shape)) != 1:
        rec.skip("rmsnorm: normalized over more than the last dim")
        return
    rec.record("rmsnorm", "fp32-acc", _rmsnorm_inputs(x, _arg(args, kwargs, 2, "weight")))


def _linear(rec: Recorder, args: tuple, kwargs: dict) -> None:
    x = _arg(args, kwargs, 0, "input")
    w = _arg(args, kwargs, 1, "weight")
    # (m, in), (in, out): views made only for a call the recorder keeps (two tensor ops cost a monitor
    # more than its skip of an unsampled call)
    rec.record("matmul", "torch", lambda: {"a": x.reshape(-1, x.shape[-1]), "b": w.T}, dtype=_autocast_name(x, "matmul"))


def _addmm(rec: Recorder, args: tuple, kwargs: dict) -> None:
    """torch.addmm(input, mat1, mat2, *, beta=1, alpha=1) = beta * input + alpha * (mat1 @ mat2), and
    Tensor.addmm (self is input): transformers' Conv1D (GPT-2, ImageGPT, DecisionTransformer) runs its
    every projection through it, and 8 of a 2-layer GPT-2's 9 matmuls went unrecorded. Recorded as the
    catalog matmul a @ b with a = mat1, b = mat2 when alpha == 1 and beta is 0 or 1: the GEMM is the
    same, and the bias (beta=1) is added to the float32 accumulator in the GEMM's epilogue (cuBLASLt's
    bias epilogue, or cuBLAS's beta * C) before the one rounding to the output dtype. Not modelled: that
    addition itself (a bias that carries an output past the dtype's range, or cancels it); the sketch
    describes the product only. Other alpha/beta scale the result, not a catalog param: skipped."""
    a, b = _arg(args, kwargs, 1, "mat1"), _arg(args, kwargs, 2, "mat2")
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.ndim != 2 or b.ndim != 2:
        return  # not a call addmm runs (it raises)
    alpha, beta = kwargs.get("alpha", 1), kwargs.get("beta", 1)
    if len(args) > 3 or not (_is_number(alpha, (1,)) and _is_number(beta, (0, 1))):
        rec.skip("matmul: addmm with alpha != 1 or beta not 0 or 1 (a scale is not a catalog param)")
        return
    rec.record("matmul", "torch", lambda: {"a": a, "b": b}, dtype=_autocast_name(a, "matmul"))


def _is_number(v: Any, allowed: tuple[int, ...]) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v in allowed


def _matmul(rec: Recorder, args: tuple, kwargs: dict) -> None:
    a = _arg(args, kwargs, 0, "input")
    b = _arg(args, kwargs, 1, "other", kwargs.get("mat2"))
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.ndim < 2 or b.ndim != 2:
        return  # batched products of two >2-D tensors are not catalog matmuls
    rec.record("matmul", "torch", lambda: {"a": a.reshape(-1, a.shape[-1]), "b": b}, dtype=_autocast_name(a, "matmul"))


# torch's fused fast path of nn.MultiheadAttention and nn.TransformerEncoderLayer (eval, no autograd:
# no_grad or inference_mode, which is how `optwin capture` runs models), with the catalog calls each one
# runs inside C++: none of them reaches the functions above. A capture turns the fast path off for its
# duration (_fastpath_off), so these run only under a monitor, which leaves production's fast path on
# and counts them in `skipped`. Recording them would take the projections' outputs, which the call
# computes inside; a monitor that recomputed them would double the layer's cost on every sampled call.
_FASTPATH_CALLS = {
    "_native_multi_head_attention": {"attention": 1, "matmul": 2},  # in_proj, out_proj
    "_transformer_encoder_layer_fwd": {"attention": 1, "matmul": 4, "layernorm": 2},  # + linear1/2, norm1/2
}


def _fastpath(name: str) -> Callable[[Recorder, tuple, dict], None]:
    def count(rec: Recorder, args: tuple, kwargs: dict) -> None:
        for op, n in _FASTPATH_CALLS[name].items():
            if rec.watches(op):
                rec.skip(f"{op}: inside torch.{name} (torch's MHA fast path; a capture turns it off, a monitor "
                         "does not)", n)
    return count


# The torch functions the capture intercepts (optwin.ingest.intercept), with the op each records.
TARGETS: tuple[Target, ...] = (
    *(Target(owner, "softmax", "softmax", _softmax) for owner in (F, torch, torch.Tensor)),
    Target(F, "scaled_dot_product_attention", "attention", _sdpa),
    *(Target(owner, "layer_norm", "layernorm", _layer_norm) for owner in (F, torch)),
    *(Target(owner, "rms_norm", "rmsnorm", _rms_norm) for owner in (F, torch)),
    Target(F, "linear", "matmul", _linear),
    *(Target(owner, name, "matmul", _matmul)
      for owner, name in ((torch, "matmul"), (torch.Tensor, "matmul"), (torch.Tensor, "__matmul__"),
                          (torch, "mm"), (torch.Tensor, "mm"))),
    # not addmm_ (no transformers model calls it, and a monitor's float32 rerun of an in-place call would
    # write a copy) nor bmm/baddbmm (batched products: not catalog matmuls, as in _matmul)
    *(Target(owner, "addmm", "matmul", _addmm) for owner in (torch, torch.Tensor)),
    *(Target(torch, name, "|".join(calls), _fastpath(name)) for name, calls in _FASTPATH_CALLS.items()
      if hasattr(torch, name)),
)


def watched_targets(rec: Recorder) -> tuple[Target, ...]:
    """The TARGETS whose op `rec` records: a call of an unwatched op would only pass through the
    wrapper (its handler never runs and it suppresses nothing), so its function stays unwrapped. A
    monitor of rmsnorm and rope on a Llama passed ~45 F.linear / matmul / softmax calls a forward
    through the wrappers."""
    return tuple(t for t in TARGETS if rec.watches(t.op))


class _Interceptor:
    """One recorder's handling of the intercepted calls: record (unless suppressed or not watched),
    then run the call. Its own work and the call run suppressed, so the torch functions they call
    (F.layer_norm calls torch.layer_norm; the sketch calls matmul) are not recorded again.
    Subclasses (optwin.monitor's) choose how the call runs (`run`) and which handler errors pass
    through (`passes`)."""

    passes: tuple[type[BaseException], ...] = ()  # handler errors that propagate (all others are counted)

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def handle(self, target: Target, args: tuple, kwargs: dict, proceed: Callable[[tuple, dict], Any]) -> Any:
        rec = self.rec
        rec.action = None  # a verdict a module hook left behind is not this call's
        local = rec._local  # this thread's (direct: the property costs on every call)
        if local.suppress or not rec.watches(target.op) or rec.foreign():  # foreign: another model's call
            return proceed(args, kwargs)
        local.suppress += 1
        try:
            try:
                target.handler(rec, args, kwargs)
            except self.passes:
                raise
            except Exception as e:  # noqa: BLE001  never break the model
                _handler_failed(rec, target.op, target.name, e)
            if rec.action is None:  # no policy verdict on this call (always, in a capture): as is
                return proceed(args, kwargs)
            return self.run(args, kwargs, proceed)
        finally:
            local.suppress -= 1

    def run(self, args: tuple, kwargs: dict, proceed: Callable[[tuple, dict], Any]) -> Any:
        """The recorded call itself, after its handler set a verdict (rec.action)."""
        return proceed(args, kwargs)


# ----------------------------------------------------------------------------- modules


_VARIANT_CACHE: dict[type, tuple[str, str] | None] = {}


def classify_module(mod: nn.Module) -> tuple[str, str] | None:
    """(op, variant) for modules whose numerics make them a catalog variant, ("rope-tables", "")
    for rotary-embedding modules, None for everything else."""
    cls = type(mod)
    if cls in _VARIANT_CACHE:
        return _VARIANT_CACHE[cls]
    name = cls.__name__
    out: tuple[str, str] | None = None
    if name.endswith("RotaryEmbedding"):
        out = ("rope-tables", "")
    elif name.endswith("RMSNorm") or name.endswith("T5LayerNorm"):
        try:
            src = inspect.getsource(cls.forward)
        except (OSError, TypeError):
            src = ""
        # torch's F.rms_norm computes in float32 for 16-bit inputs (torch.nn.RMSNorm's whole forward): fp32-acc
        upcast = "float32" in src or ".float()" in src or "rms_norm(" in src
        out = ("rmsnorm", "fp32-acc" if upcast else "native-dtype")
    _VARIANT_CACHE[cls] = out
    return out


# Norm classes whose forward scales by (1 + weight) (Gemma's RMSNorm: `output * (1.0 + self.weight.float())`,
# weights initialised to zeros): class -> the dtype the sum is computed in (None: the weight's own), or
# False for a plain `weight * x`.
_NORM_OFFSET: dict[type, Any] = {}
# Both ends anchored: `1 + self.weight_scale` and `0.1 + self.weight` are not 1 + w, and neither is
# `1 + self.weight * s` or `self.weight + 1e-6`; `self.weight + 1` is. The cast (group c1 or c2) says float32.
_ONE = r"(?<![\w.])1(?:\.0*)?"
_SELF_W = r"(?<![\w.])self\.weight(?:(?P<c{}>\.float\(\)|\.to\(torch\.float32\))|(?![\w.]))"
_NOT_OPERAND = r"(?!\s*[*/@%])"  # the sum, not a product with the weight or the 1
_OFFSET_RE = re.compile(rf"{_ONE}\s*\+\s*{_SELF_W.format(1)}{_NOT_OPERAND}"
                        rf"|{_SELF_W.format(2)}\s*\+\s*{_ONE}(?![\w.]){_NOT_OPERAND}")


def _version(t: torch.Tensor) -> int | None:
    """t's version counter, None for a tensor made under torch.inference_mode (it has none: `_version`
    raises, and in a hook or wrapped function that broke the model's forward). The verdicts kept per
    tensor below are then recomputed on every call, as WeightCache does, except the rotary table check's
    (_table_reason: kept by the buffer's identity)."""
    return None if t.is_inference() else t._version


def _unchanged(seen: tuple[Any, ...] | None, t: torch.Tensor, v: int | None) -> bool:
    """Whether a verdict kept as (tensor, version, ...) is still t's: the same tensor, unmodified since (v, its
    _version now; None, an inference tensor, never counts as unchanged)."""
    return seen is not None and seen[0] is t and v is not None and seen[1] == v


def _norm_offset(cls: type) -> Any:
    if cls not in _NORM_OFFSET:
        try:
            src = inspect.getsource(cls.forward)
        except (OSError, TypeError):
            src = ""
        m = _OFFSET_RE.search(src)
        _NORM_OFFSET[cls] = False if m is None else (torch.float32 if m.group("c1") or m.group("c2") else None)
    return _NORM_OFFSET[cls]


def _norm_weight(rec: Recorder, mod: nn.Module) -> torch.Tensor | None:
    """The weight an RMSNorm module multiplies by: its `weight`, or for a Gemma-style norm computing
    x * (1 + w) the effective 1 + w, in the dtype the module computes it in (Gemma3: float32). The raw w
    (zeros at init) was recorded as the weight: weight_absmax 0.0 where the norm scales by 1.0. Kept per
    module while the weight is the same tensor, unmodified."""
    w = getattr(mod, "weight", None)
    if not isinstance(w, torch.Tensor):
        return None
    off = _norm_offset(type(mod))
    if off is False:
        return w
    seen, v = rec._norm_weights.get(id(mod)), _version(w)
    if _unchanged(seen, w, v):
        return seen[2]
    with torch.no_grad():
        eff = 1.0 + (w.to(off) if off is not None else w)
    rec._norm_weights[id(mod)] = (w, v, eff)
    return eff


def _rope_params(mod: nn.Module, layer_type: str | None) -> dict:
    """The module's config rope_parameters for this call: Gemma3's are keyed by layer type
    ({"sliding_attention": {...base 1e4}, "full_attention": {...base 1e6}})."""
    rp = getattr(getattr(mod, "config", None), "rope_parameters", None)
    if not isinstance(rp, dict):
        return {}
    if layer_type is not None:
        return rp.get(layer_type) if isinstance(rp.get(layer_type), dict) else {}
    return rp


def _rope_inv(mod: nn.Module, layer_type: str | None) -> Any:
    """The module's inverse frequencies for this call (Gemma3: one buffer per layer type)."""
    return getattr(mod, f"{layer_type}_inv_freq" if layer_type is not None else "inv_freq", None)


def _rope_base(mod: nn.Module, layer_type: str | None = None) -> float | None:
    """The rotary module's base for a call with this layer_type (None: a module with one rope). A
    module with ropes per layer type has no single rope_theta: its base comes from that type's
    parameters or inverse frequencies, never from the config's top level (Gemma3 was recorded with
    10000 for its full-attention layers, base 1e6)."""
    cfg = getattr(mod, "config", None)
    top = (getattr(cfg, "rope_theta", None), getattr(mod, "base", None)) if layer_type is None else ()
    for v in (_rope_params(mod, layer_type).get("rope_theta"), *top):
        if isinstance(v, (int, float)) and v > 1:
            return float(v)
    inv = _rope_inv(mod, layer_type)
    if isinstance(inv, torch.Tensor) and inv.numel() > 1:  # inv[1] = base^(-2/d), d = 2 * len(inv)
        return _base_from_inv(inv)
    return None


def _base_from_inv(inv: torch.Tensor) -> float:
    """The base whose catalog inverse frequencies are this buffer. inv[1] ** -n amplifies inv[1]'s float32
    rounding n times (head dim 128, base 1e4: 9999.978), and the catalog's table for that base is not the
    buffer (_rope_reason skipped every such rope). The derived base rounded to the fewest significant
    digits whose catalog table is the buffer (the check _rope_reason makes) is the base the module was
    built with; none matching (frequencies scaled or not HF's formula) leaves the derived base, which
    _rope_reason then rejects."""
    derived = float(inv[1].double() ** (-float(inv.numel())))
    if not math.isfinite(derived) or derived <= 0:
        return derived
    got = inv.detach().float().cpu()
    for digits in range(1, 10):
        cand = float(f"{derived:.{digits - 1}e}")
        if torch.allclose(got, _catalog_inv(cand, inv.numel()), rtol=2.0 ** -20, atol=0.0):
            return cand
    return derived


def _catalog_inv(base: float, n: int) -> torch.Tensor:
    """The catalog's fp32-angles inverse frequencies for a head dim of 2n (optwin.catalog's rope)."""
    d = 2 * n
    return 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))


def _rope_reason(rec: Recorder, mod: nn.Module, base: float | None, layer_type: str | None = None) -> str | None:
    """Why the rotary module's cos/sin are not the catalog's fp32-angles tables for (positions, base),
    or None when they are. HF's scaled ropes (rope_type linear, llama3, yarn, dynamic, ...) change the
    inverse frequencies and/or multiply cos/sin by attention_scaling: recorded with only the base, their
    cos differed from the catalog's by up to 2.0. The inverse frequencies are checked against the
    catalog's too (a rotary class without a rope_type that scales them); that check costs a sync, so
    its verdict is kept while the buffer stays the same tensor, unmodified."""
    rtype = getattr(mod, "rope_type", None)
    if isinstance(rtype, dict):  # per layer type (Gemma3)
        rtype = rtype.get(layer_type)
    if not isinstance(rtype, str):
        rtype = _rope_params(mod, layer_type).get("rope_type")
    if rtype not in (None, "default"):
        return f"rope: scaled rope_type {rtype} is not a catalog variant"
    scaling = getattr(mod, "attention_scaling" if layer_type is None else f"{layer_type}_attention_scaling", 1.0)
    if isinstance(scaling, (int, float)) and scaling != 1.0:
        return f"rope: attention_scaling {scaling:g} is not a catalog variant"
    if base is None:
        return "rope: base unknown" if layer_type is None else f"rope: base unknown for layer type {layer_type}"
    inv = _rope_inv(mod, layer_type)
    if not isinstance(inv, torch.Tensor) or inv.ndim != 1 or inv.numel() < 1:
        return None  # nothing to check against: the base is all the module tells
    key = (id(mod), layer_type)
    seen, v = rec._rope_checked.get(key), _version(inv)
    if _unchanged(seen, inv, v) and seen[2] == base:
        return seen[3]
    ref = _catalog_inv(base, inv.numel())
    # ulp-level differences (inv computed another way) pass; any scaling of the frequencies does not
    ok = torch.allclose(inv.detach().float().cpu(), ref, rtol=2.0 ** -20, atol=0.0)
    if ok:
        reason = None
    elif inv.dtype != torch.float32:  # model.to(half) rounds the buffer, and HF's angles come from the rounded one
        reason = f"rope: inv_freq in {_dtype_name(inv)} (a model cast with .to()), not the catalog's float32"
    else:
        reason = f"rope: inv_freq is not the catalog's for base {base:g}"
    rec._rope_checked[key] = (inv, v, base, reason)
    return reason


def _call_kind(m: nn.Module, kind: tuple[str, str] | None, args: tuple, kwargs: dict) -> tuple[str, str] | None:
    """The module's kind for this call: a module optwin.kernels.patch swapped runs the op's `triton`
    kernel (checked per call: a patch can come and go while the hooks stay), unless its forward runs the
    model's own code on these arguments (the patch's kernel_runs, the test the patched forward makes:
    a bfloat16 input with float32 LayerNorm/RMSNorm weights, float64, gradients), when the call is the
    unpatched module's. Taken for the kernel's, such a call was left to a kernel that never ran: under a
    monitor nothing recorded it (the hook also suppressed the F.layer_norm inside), under a capture it
    was recorded as the triton variant."""
    fused = sketch_sink.fused_op(m)
    if fused is None:
        return kind
    x = args[0] if args else next(iter(kwargs.values()), None)
    if isinstance(x, torch.Tensor):
        # patching is loaded: only a patch lists modules in FUSED (it imports this module: no import at the top)
        from optwin.kernels.patching import kernel_runs

        if not kernel_runs(m, x):
            return kind
    return fused, "triton"


def _hooked(mod: nn.Module, kind: tuple[str, str] | None) -> bool:
    """Modules that get forward hooks: variants and rotary modules (classify_module), and the norms
    optwin.kernels.patch may swap while the hooks stay. Other modules name their calls through
    Recorder.stream's frame walk."""
    name = type(mod).__name__
    return kind is not None or isinstance(mod, nn.LayerNorm) or name.endswith(("RMSNorm", "LayerNorm"))


HOOK_FAILED = "rope: the rotary module's hook failed (see skipped)"  # a rotary call's verdict until its checks pass


def _pre_record(rec: Recorder, m: nn.Module, kind: tuple[str, str], args: tuple, kwargs: dict) -> None:
    """A hooked module's call, as its forward begins: record a norm, or remember a rotary module's
    positions, base and verdict for the apply_rotary_pos_emb calls that use its table."""
    op, variant = kind
    fused_here = variant == "triton" and rec.takes_fused  # the kernel hands its own sketch over
    if op == "rmsnorm" and args and not fused_here:
        rec.record("rmsnorm", variant, _rmsnorm_inputs(args[0], _norm_weight(rec, m)))
    elif op == "layernorm" and args and not fused_here:
        rec.record("layernorm", variant,
                   _layernorm_inputs(args[0], getattr(m, "weight", None), getattr(m, "bias", None)))
    elif op == "rope-tables":
        pos = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        lt = kwargs.get("layer_type", args[2] if len(args) > 2 else None)
        lt = lt if isinstance(lt, str) else None
        # A failure below leaves this verdict on the table the post-hook keeps, so this call's rope is skipped,
        # never recorded with the base and verdict an earlier call left behind.
        rec.last_rope_reason = HOOK_FAILED
        rec._rope_pending = (m, lt)
        rec.last_positions = pos if isinstance(pos, torch.Tensor) else None
        rec.last_base = _rope_base(m, lt)
        rec.last_rope_reason = _rope_reason(rec, m, rec.last_base, lt)


def _install_module_hooks(rec: Recorder, model: nn.Module,
                          overrides: dict[Any, tuple[str, str]]) -> list[Any]:
    handles: list[Any] = []
    for path, mod in model.named_modules():
        rec._paths[id(mod)] = path
        kind0 = overrides.get(type(mod), overrides.get(type(mod).__name__)) or classify_module(mod)
        if not _hooked(mod, kind0):
            continue

        def pre(m: nn.Module, args: tuple, kwargs: dict, path: str = path, kind0: Any = kind0) -> None:
            if threading.get_ident() != rec.owner:  # another thread running the model: not this capture's call
                return
            local = rec._local  # this thread's suppress and stack (direct: the properties cost on every call)
            local.stack.append((path, m, False))  # True once this call holds a suppress count (post gives it back)
            kind = _call_kind(m, kind0, args, kwargs)
            if kind is None:
                return
            if not local.suppress:
                _guarded(rec, "rope" if kind[0] == "rope-tables" else kind[0], "a module's forward pre-hook", _pre_record,
                         rec, m, kind, args, kwargs, site=path or type(m).__name__)
            local.suppress += 1
            local.stack[-1] = (path, m, True)

        def post(m: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            if threading.get_ident() != rec.owner:
                return
            local = rec._local
            try:
                if rec._rope_pending is not None and rec._rope_pending[0] is m:
                    _keep_rope_table(rec, out)
            except Exception as e:  # noqa: BLE001  never break the model
                _handler_failed(rec, "rope", "a module's forward hook", e, path or type(m).__name__)
            finally:  # the stack and suppress count stay balanced whatever failed
                if local.stack and local.stack.pop()[2]:  # the pre-hook's own kind test, not repeated here
                    local.suppress -= 1

        handles.append(mod.register_forward_pre_hook(eager_under_compile(pre, _skip), with_kwargs=True))
        handles.append(mod.register_forward_hook(eager_under_compile(post, _skip), with_kwargs=True, always_call=True))
    return handles


def _skip(*args: Any, **kwargs: Any) -> None:
    return None


def _keep_rope_table(rec: Recorder, out: Any) -> None:
    """Remember the (cos, sin) a rotary call returned with its positions, base and verdict, keyed by the
    module and layer type: a model may build several tables before its layers run (Gemma3: one per
    layer type), so apply_rotary_pos_emb finds its own by the cos it is handed, not the last one
    built. Keeps the last table per key (the tensors stay referenced until replaced)."""
    m, lt = rec._rope_pending
    rec._rope_pending = None
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        if rec.last_rope_reason is None:  # the pre-hook's checks passed: now the tables the module made
            sin = out[1] if len(out) > 1 and isinstance(out[1], torch.Tensor) else None
            rec.last_rope_reason = HOOK_FAILED  # should the check raise, this call's rope is skipped
            rec.last_rope_reason = _table_reason(rec, m, lt, out[0], sin)
        rec._rope_tables[(id(m), lt)] = (out[0], rec.last_positions, rec.last_base, rec.last_rope_reason)


TABLE_REASON = "rope: the rotary module's cos/sin are not cos/sin of positions x inv_freq (scaled or built otherwise)"


def _table_reason(rec: Recorder, m: nn.Module, lt: str | None, cos: torch.Tensor, sin: torch.Tensor | None) -> str | None:
    """TABLE_REASON when the (cos, sin) a rotary call returned are not cos/sin of its positions times its
    inverse frequencies (float32 angles, cast to the tables' dtype: the catalog's fp32-angles tables once
    _rope_reason has matched the frequencies to the base), else None. _rope_reason judges the module by
    its buffer, rope_type and HF's attention_scaling attribute; a module that scales its tables under
    another name (DeepSeek's yarn rotary multiplies them by its `_mscale`) passed all three and was
    recorded as the catalog's rope. The reference is built as the module builds it, on its device, so a
    faithful module matches to the last bit (a one-ulp rounding flip is allowed). The check syncs once:
    its verdict is kept per module and layer type while the buffer, base, dtype, device and width stay."""
    pos, base = rec.last_positions, rec.last_base
    if pos is None or base is None:  # rope is skipped for that already
        return None
    inv = _rope_inv(m, lt)
    if not (isinstance(inv, torch.Tensor) and inv.ndim == 1 and inv.numel() >= 1):
        inv = None  # no buffer: the catalog's frequencies for the base
    d = cos.shape[-1]
    sig = (base, cos.dtype, cos.device, d)
    key, v = (id(m), lt), (_version(inv) if inv is not None else 0)
    seen = rec._rope_tables_checked.get(key)
    # an inference tensor has no version (v None): its verdict is kept by the buffer's identity and the
    # signature alone (HF changes inv_freq by assigning a new buffer: dynamic rope, a moved model). Its v was
    # required, so a model built under torch.inference_mode re-ran the check, and its sync, on every forward.
    if seen is not None and seen[0] is inv and seen[1] == v and seen[2] == sig:
        return seen[3]
    with torch.no_grad(), autocast_dtype.off(cos.device.type):
        f = (inv if inv is not None else _catalog_inv(base, max(d // 2, 1))).to(cos.device, torch.float32)
        reason: str | None = TABLE_REASON
        if d == 2 * f.numel():
            ang = pos.to(cos.device, torch.float32)[..., None] * f  # (..., seq, d/2) float32
            emb = torch.cat((ang, ang), dim=-1)  # (..., seq, d)
            gaps = []
            try:
                for got, fn in ((cos, torch.cos), (sin, torch.sin)):
                    if got is not None:  # in units of the tables' eps: a one-ulp flip of the cast is 1 at most
                        gap = (got.float() - fn(emb).to(got.dtype).float()).abs().amax()
                        gaps.append(gap / torch.finfo(got.dtype).eps)
                if float(torch.stack(gaps).max()) <= 2.0:  # one sync; NaN fails too
                    reason = None
            except RuntimeError:  # shapes that do not broadcast: not tables of these positions
                pass
    rec._rope_tables_checked[key] = (inv, v, sig, reason)
    return reason


# ----------------------------------------------------------------------------- wrapped functions


def _attention_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """q, k, v of an attention call (eager's, sdpa's), grouped keys and values repeated to q's heads (GQA)."""
    k, v = key, value
    if k.shape[1] != query.shape[1] and query.shape[1] % k.shape[1] == 0:
        rep = query.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return {"q": query, "k": k, "v": v}


class _MaskVerdict(NamedTuple):
    """What _mask_verdict read off an HF attention mask, kept per mask tensor and version in rec._mask_seen."""

    mask: Any
    version: int | None
    # n when query row i sees exactly the keys j <= n - seq_q + i (causal, bottom-right, over the first n keys)
    used: int | None
    # neither that nor causal plus padding (a sliding window, a bias: MASK_SKIP)
    other: bool
    seq_q: int
    # causal or bidirectional plus padding: each batch row's live keys [s, e); () where a row's are not one span
    # (holes, or none: PADDING_HOLES_SKIP)
    spans: tuple[tuple[int, int], ...] | None
    # bidirectional plus padding: each live token's query row sees exactly its batch row's live keys (an encoder's
    # padded batch), or, seq_q != seq_k (cross-attention over a padded encoder), every query row does. Where
    # seq_q == seq_k the call cannot be told from a cross-attention whose lengths agree: both keep today's verdict
    # (_mask_form's rows: the pad tokens' query rows dropped)
    bidir: bool
    # the key count causal plus padding is bottom-right aligned to: the last live key's end where only that
    # alignment matched (a static cache's written slots: the rest masked in every row), else seq_k
    keys: int


def _mask_verdict(rec: Recorder, mask: Any, seq_q: int, seq_k: int) -> _MaskVerdict:
    """The verdict on an HF attention mask (_MaskVerdict). `used`: n when the mask lets query row i see exactly
    the keys j <= n - seq_q + i, every other key masked, in every batch row and head: causal, bottom-right
    aligned, over the first n keys, the rest unused. A static KV cache passes all of its max_cache_len slots with
    the unwritten ones masked: its prefill (12 queries, 14 slots) was recorded non-causal over 14 keys, its decode
    steps over the empty slots too. A mask of one row for all seq_q query rows (a packed GQA decode step, see
    _sdpa) gives n when that row allows exactly the first n keys. None for any other mask (padding, sliding
    windows, additive biases), which the other fields then describe. A mask it does not read (none, other shapes)
    gets the verdict of no mask. The check syncs twice per mask (three times for a padded batch's): every layer is
    handed the same tensor (HF builds a model's mask once, an encoder's too: BertModel's
    create_bidirectional_mask), whose verdict is kept in rec._mask_seen."""
    if not isinstance(mask, torch.Tensor) or mask.ndim != 4 or mask.shape[-1] != seq_k or mask.shape[-2] not in (seq_q, 1):
        return _MaskVerdict(mask, None, None, False, seq_q, None, False, seq_k)
    # one row for all query rows (HF's pack_gqa decode): every query sees the same keys, the first n of them
    shared = mask.shape[-2] == 1
    seen, v = rec._mask_seen, _version(mask)
    if _unchanged(seen, mask, v) and seen.seq_q == seq_q:
        return seen
    with torch.no_grad():
        allowed = mask if mask.dtype == torch.bool else mask == 0
        n = int(allowed[..., -1, :].sum(-1).max())
        i = torch.arange(seq_q, device=mask.device)[:, None]
        j = torch.arange(seq_k, device=mask.device)[None, :]
        if shared:
            ok = n >= 1 and bool((allowed == (j < n)).all())
        else:
            ok = seq_q <= n and bool((allowed == (j <= n - seq_q + i)).all())
        other, spans, bidir, keys = False, None, False, seq_k
        if not ok:  # causal (bottom-right over all keys) with the keys no row of a batch row sees (padding) masked?
            pad = ~allowed.any(-2, keepdim=True).any(-3, keepdim=True)  # (b, 1, 1, seq_k)
            # each batch row's live keys: first, end past the last, count (one span when count == end - first);
            # read in the same sync as the verdict
            live = (~pad).reshape(pad.shape[0], seq_k).int()  # (b, seq_k)
            first, end = live.argmax(-1), seq_k - live.flip(-1).argmax(-1)
            # bottom-right aligned to seq_k, or to the last live key of any batch row: a static cache's slots past
            # the written ones are masked in every row, and its left-padded prefill (7 queries, 10 slots: query i
            # sees the row's live keys j <= i) was MASK_SKIP against the mask aligned to slot 10. Both, since a
            # batch whose every row ends in pad tokens (pad_to_multiple_of) is aligned to seq_k with its last
            # keys dead. The first that matches gives keys.
            verdicts = []
            for last in (seq_k, end.max()):
                want = (torch.ones_like(j, dtype=torch.bool) if shared else j <= last - seq_q + i) & ~pad
                dead = ~want.any(-1, keepdim=True)  # a padding token's query row: whatever the model left in it
                verdicts.append(((allowed == want) | dead).all())
            # or bidirectional plus padding (an encoder's self-attention): each live token's query row (query i is
            # token i) sees exactly its batch row's live keys; a pad token's row whatever the model left in it. A
            # shared mask's padding verdict above is already this one.
            # Any other seq_q (cross-attention: decoder queries over a padded encoder's keys) has no token i for
            # query i: every query row must see exactly the live keys.
            if seq_q == seq_k > 1 and not shared:
                bi = ((allowed == ~pad) | pad.transpose(-1, -2)).all()
            elif seq_q > 1 and not shared:
                bi = (allowed == ~pad).all()
            else:
                bi = torch.zeros((), dtype=torch.bool, device=mask.device)
            got = torch.cat([torch.stack(verdicts + [bi]).long(), first, end, live.sum(-1)]).tolist()
            b, at_k, at_last = live.shape[0], got[0], got[1]
            other, bidir, got = not (at_k or at_last), bool(got[2]), got[2:]
            rows = list(zip(got[1:1 + b], got[1 + b:1 + 2 * b], got[1 + 2 * b:]))
            spans = tuple((s, e) for s, e, _ in rows) if all(0 < c == e - s for s, e, c in rows) else ()
            if at_last and not at_k:
                keys = max(e for _, e, _ in rows)
    rec._mask_seen = _MaskVerdict(mask, v, n if ok else None, other, seq_q, spans, bidir, keys)
    return rec._mask_seen


def _rope_inputs(x: torch.Tensor, pos: torch.Tensor, unsqueeze_dim: int,
                 dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """One of apply_rotary_pos_emb's q / k as the catalog's (b*s, h, d) x, with its (b*s,) positions;
    x in `dtype`, the dtype the call computes in (a widening: exact)."""
    xs = x.transpose(1, 2) if unsqueeze_dim == 1 else x  # (b, s, h, d)
    if dtype is not None and xs.dtype != dtype:
        xs = xs.to(dtype)
    b, s, h, d = xs.shape
    p = pos.reshape(-1, pos.shape[-1]).expand(b, s).reshape(-1)  # (b*s,)
    return {"x": xs.reshape(b * s, h, d), "positions": p}


# The wrapped functions hand `record` a function that makes the inputs, not the inputs: a monitor calls
# it only for the calls its sampling keeps, and not at all for ops it does not watch. Made eagerly, the
# GQA repeat (copies of k and v, every eager attention call of a GQA model) and rope's (b*s, h, d)
# copies ran on every call. (It did not move the host time of the H200's host-bound Llama forward
# with the monitor at default sampling, +12.5 %: bench/results/monitor_fused_h200_s27_small_lazy.md.)
def _record_eager(rec: Recorder, orig: Callable, module, query, key, value, attention_mask, *args, **kwargs) -> None:  # noqa: ANN001
    if not _default_scale(rec, args[0] if args else kwargs.get("scaling"), query.shape[-1]):  # HF's `scaling`
        return
    form = _mask_form(rec, attention_mask, query.shape[2], key.shape[2], lambda: getattr(module, "is_causal", False))
    if form is None:
        return
    n, causal, spans, rows = form
    dtype = _autocast_name(query, "attention")
    # unused (static cache) slots dropped, a padded batch split by its rows' live keys (_attention_parts)
    for q, k, v in _attention_parts(query, key, value, n, spans, rows):
        rec.record("attention", "math", functools.partial(_attention_inputs, q, k, v), {"causal": causal}, dtype=dtype)


def rope_table_of(rec: Recorder, cos: Any) -> tuple[Any, float | None, str | None]:
    """(positions, base, skip reason or None) of the rotary table `cos` came from: a model may build several
    before its layers run (Gemma3: one per layer type), found by the tensor itself. A cos made elsewhere (or None:
    a patched kernel's call, handed only its sketch) takes the last table built, unless tables of other bases were
    built too, when which one it used is unknown."""
    for table in rec._rope_tables.values():
        if cos is not None and table[0] is cos:
            return table[1], table[2], table[3]
    reason = rec.last_rope_reason
    if reason is None and len({t[2] for t in rec._rope_tables.values()}) > 1:
        reason = "rope: cos/sin from no known rotary table, and the tables' bases differ"
    return rec.last_positions, rec.last_base, reason


PARTIAL_ROTARY_SKIP = "rope: partial rotary (cos/sin narrower than q: the catalog's rope rotates every dim)"


def _record_rope(rec: Recorder, orig: Callable, q, k, cos, sin, *args, **kwargs) -> None:  # noqa: ANN001
    # our patched rotary (optwin.kernels.patch) hands a monitor its fused sketch itself, when its kernel runs: on
    # a call it leaves to the model's code (gradients, partial rotary, off the kernels' device) no kernel does
    if rec.takes_fused and sketch_sink.fused_function(orig) == "rope":
        from optwin.kernels.patching import rotary_runs  # loaded: only a patch makes a fused function

        if rotary_runs(orig, q, k, cos, sin, *args, **kwargs):
            return
    unsq = kwargs.get("unsqueeze_dim", args[1] if len(args) > 1 else 1)
    pos, base, reason = rope_table_of(rec, cos)
    if pos is None or q.ndim != 4:
        rec.skip("rope: positions unknown (no rotary-embedding module ran)")
    elif reason is not None or base is None:
        rec.skip(reason or "rope: base unknown", 2)  # q and k
    elif isinstance(cos, torch.Tensor) and cos.shape[-1] != q.shape[-1]:
        # partial rotary (Phi-3's partial_rotary_factor, GPT-NeoX's rotary_pct, StableLM, Phi-2): the call rotates
        # only q's first cos.shape[-1] dims and passes the rest through; recorded as the catalog's full-width rope
        # its twin rotated them all (0.6 off the model's output). The catalog's rope has no rotary width.
        rec.skip(PARTIAL_ROTARY_SKIP, 2)
    elif rec.watches("rope"):  # record() would drop both calls; the stream's frame walk need not run
        params = {"base": base}
        site = rec.stream
        for name, x in (("q", q), ("k", k)):
            # x * cos + rotate_half(x) * sin computes in the promotion of x's and the tables' dtypes: under
            # autocast q is bfloat16 and cos/sin float32 (built from the float32 hidden states), so the
            # call runs, and returns, float32; it was recorded as bfloat16
            dt = torch.result_type(x, cos) if isinstance(cos, torch.Tensor) else x.dtype
            rec.record("rope", "fp32-angles", functools.partial(_rope_inputs, x, pos, unsq, dt), params,
                       dtype=_DTYPE_NAMES.get(dt) or str(dt).removeprefix("torch."), stream=f"{site}:{name}")


# A patched eager attention call (optwin.kernels.patch) runs our Triton softmax and is recorded as softmax "triton"
# (_record_eager_unfused), never as attention: a capture or monitor whose ops leave softmax out records nothing of
# it, and counts it here so the empty result says why.
PATCHED_EAGER_SKIP = "attention: run by the patched softmax kernel, recorded as softmax/triton (watch softmax)"


def _record_eager_unfused(rec: Recorder, orig: Callable, *args: Any, **kwargs: Any) -> None:
    """_record_eager, except for a call that our patched eager attention (optwin.kernels.patch, applied before the
    capture or monitor wrapped it) runs with its Triton softmax: that call computes QK^T * scale (+ mask), our
    softmax, @ V, where attention "math" names torch's softmax inside, so its twin replayed numerics that never ran.
    It is recorded as what ran, softmax "triton": under a monitor taking fused sketches ("warn") by the kernel's own
    fused sketch (nothing here); under a capture or a "raise"/"fallback" monitor by the scores the patched function
    hands its kernel (eager_scores), whose sample a capture keeps. The call is queued here, not recorded: the
    scores exist only inside the call, and recomputing QK^T here would cost a matmul and could differ from what ran.
    A call the patch leaves to the model's code (float64, gradients, an undone patch) is attention "math" still."""
    if sketch_sink.fused_function(orig) == "softmax":
        from optwin.kernels.patching import eager_runs  # loaded: only a patch makes a fused function

        if eager_runs(orig, *args, **kwargs):
            if not rec.watches("softmax"):
                # recorded only as softmax (by eager_scores or the kernel's fused sketch): with softmax filtered
                # out nothing of this call is kept, and an attention-only capture came back empty, unexplained
                if rec.watches("attention"):
                    rec.skip(PATCHED_EAGER_SKIP)
            elif not rec.takes_fused:
                query = _arg(args, kwargs, 1, "query")
                waiting = _EAGER.waiting
                # an entry a call left behind (it raised before its softmax) goes; the recorders of this call stay
                waiting[:] = [w for w in waiting if w[1] is query]
                waiting.append((rec, query, rec.stream))
            return
    _record_eager(rec, orig, *args, **kwargs)


class _EagerWaiting(threading.local):
    """Per thread: the (recorder, query, stream) of the patched eager call running now, for each recorder that
    records its softmax from the scores (_record_eager_unfused, eager_scores)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Recorder, torch.Tensor, str]] = []


_EAGER = _EagerWaiting()


def eager_scores(query: torch.Tensor, scores: torch.Tensor) -> str | None:
    """The patched eager_attention_forward (optwin.kernels.patching) hands over the scores it is about to give its
    Triton softmax (QK^T * scale + mask, in the dtype the kernel receives), with the call's query: each recorder
    whose wrapper queued this call (_record_eager_unfused) records it as softmax "triton" with the scores as x, in
    the stream the wrapper saw. Called before the launch, so a "raise" monitor's FaultPredicted stops the call
    before the kernel runs; any other failure is counted, never raised into the model. Nothing queued (no capture,
    a "warn" monitor): a list test.

    Returns the policy's verdict on the call: "fallback" where a "fallback" monitor predicted the softmax faults
    (its record set rec.action, as for the torch calls its interceptor reruns in float32), and the patched
    function must then compute it in float32 itself, not launch the kernel; None otherwise. No interceptor runs
    this call (our kernel is no torch function), so nothing else would read the verdict: the monitor counted a
    fallback and logged "running in float32" while the kernel ran as predicted."""
    waiting = _EAGER.waiting
    if not waiting:
        return None
    calls = [w for w in waiting if w[1] is query]
    waiting.clear()
    dtype = _dtype_name(scores)
    act = None
    for rec, _, site in calls:
        rec.action = None  # only this record's verdict counts
        _guarded(rec, "softmax", "eager_attention_forward", rec.record, "softmax", "triton", {"x": scores}, None,
                 dtype, site, site=site)
        if rec.action is not None:
            # "fallback" or "fallback32": the same float32 softmax here (the kernel's output is float32 either
            # way); taken, so no later call reads it as its own
            act, rec.action = "fallback", None
    return act


_RECORD_FN: dict[str, Callable[..., None]] = {
    "eager_attention_forward": _record_eager_unfused,
    "apply_rotary_pos_emb": _record_rope,
}
_RECORD_OP = {"eager_attention_forward": "attention", "apply_rotary_pos_emb": "rope"}  # for the skip counts


def _here_recorders() -> list[Recorder]:
    """The recorders of the captures and monitors active in this thread, outermost first."""
    return [r for r in (getattr(i, "rec", None) for i in intercept.current()) if isinstance(r, Recorder)]


class _Shared:
    """One transformers function wrapped for every capture and monitor that uses it: `users` holds one
    _Lease per start (a capture or monitor, once per module that holds the wrapper), `places` the
    (module, name) pairs it was installed at or found in, `orig` the function it wraps."""

    def __init__(self, fname: str, orig: Callable) -> None:
        self.orig = orig
        self.users: list[_Lease] = []
        self.places: list[tuple[Any, str]] = []
        self.wrapper = _wrap_function(fname, orig, self)


class _Lease(NamedTuple):
    """One start's use of a shared wrapper (the undo entry _unpatch_transformers takes back); where the
    wrapper is installed, the _Shared keeps (`places`)."""
    wrapper: Callable


# Starts and stops of captures and monitors may come from several threads.
_SHARED_LOCK = threading.Lock()


def _wrap_function(fname: str, orig: Callable, shared: _Shared) -> Callable:
    """One wrapper of a transformers function for every capture and monitor: it hands the call to each
    recorder active in the calling thread (nested captures and monitors all see it: a wrapper per
    recorder fed only the first, and the second recorded no rope or attention and the eager softmax as a
    softmax call), then runs the original with all of them suppressed. Other threads pass through, and so
    does everyone once its last user left (a wrapper that something else put back after that)."""
    handler = _RECORD_FN[fname]
    op = _RECORD_OP[fname]

    def run(*args: Any, **kwargs: Any) -> Any:
        recs = _here_recorders()
        if not recs or not shared.users:
            return orig(*args, **kwargs)
        for rec in recs:
            if rec._local.suppress == 0 and not rec.foreign():  # foreign: another model's call
                _guarded(rec, op, fname, functools.partial(handler, rec, orig, *args, **kwargs))
        for rec in recs:
            rec._local.suppress += 1
        try:
            return orig(*args, **kwargs)
        finally:
            for rec in recs:
                rec._local.suppress -= 1
            if fname == "eager_attention_forward" and _EAGER.waiting:
                # this call's queued entries (_record_eager_unfused) where it raised before eager_scores took them:
                # left there they kept its recorder, samples and all, and its query alive until the thread's next
                # patched call, past the capture's end
                query = _arg(args, kwargs, 1, "query")
                _EAGER.waiting[:] = [w for w in _EAGER.waiting if w[1] is not query]

    # the HF name and signature, for the checks of optwin.kernels.patch
    wrapper = functools.wraps(orig)(eager_under_compile(run, orig))
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__optwin_capture__ = True  # type: ignore[attr-defined]
    wrapper._optwin_shared = shared  # type: ignore[attr-defined]
    return wrapper


def _patch_transformers(rec: Recorder) -> list[_Lease]:
    """Wrap the functions of _RECORD_FN in every loaded transformers modeling module; returns the leases
    for _unpatch_transformers. A function already wrapped (a capture or monitor still running) keeps its
    wrapper, which feeds `rec` as well while rec's interceptor is active: the first user wraps, the last
    one to leave, in whatever order they leave, puts the original back. (Each user setting back what it
    found left a wrapper installed for good when the outer one stopped first.)"""
    leases: list[_Lease] = []
    with _SHARED_LOCK:
        for mname, mod in list(sys.modules.items()):
            if mod is None or not mname.startswith("transformers.models."):
                continue
            for fname in _RECORD_FN:
                fn = mod.__dict__.get(fname)
                if not callable(fn):
                    continue
                shared = wrapper_state(fn)  # None too where functools.wraps copied it onto someone's wrapper of ours
                if shared is None or not shared.users:
                    # the first user wraps; a wrapper of ours whose users all left while something else was
                    # installed over it, which then put it back, only passes calls through: wrap what it wraps
                    shared = _Shared(fname, shared.orig if shared is not None else fn)
                    setattr(mod, fname, shared.wrapper)
                lease = _Lease(shared.wrapper)
                shared.users.append(lease)
                shared.places.append((mod, fname))
                leases.append(lease)
    return leases


def wrapper_state(fn: Any) -> _Shared | None:
    """The shared state of fn where fn is a capture/monitor wrapper, else None (a function functools.wraps copied
    the attribute onto is not the wrapper)."""
    shared = getattr(fn, "_optwin_shared", None)
    return shared if shared is not None and shared.wrapper is fn else None


def unwrap_idle(fn: Any) -> Any:
    """fn, or what it wraps where fn is a capture/monitor wrapper whose users have all stopped (and so on down):
    the function to put back in a wrapper's place. Called under _SHARED_LOCK."""
    while (shared := wrapper_state(fn)) is not None and not shared.users:
        fn = shared.orig
    return fn


def _unpatch_transformers(leases: list[_Lease]) -> None:
    """Give back the leases of one _patch_transformers. A wrapper whose last user this was gets its
    original back wherever it is still installed; where something else replaced it meanwhile (a kernel
    patch, a user's own monkeypatch), that replacement stays, and the wrapper, should it be put back,
    passes calls through and no longer passes for a capture's (optwin.kernels.patch replaces it)."""
    with _SHARED_LOCK:
        for lease in reversed(leases):
            shared: _Shared = lease.wrapper._optwin_shared  # type: ignore[attr-defined]
            shared.users = [u for u in shared.users if u is not lease]
            if shared.users:
                continue
            back = unwrap_idle(shared.orig)  # what it wraps may itself be a wrapper stopped meanwhile (a patch's undo
            for mod, fname in shared.places:  # pointed it there): never put back a wrapper nobody uses
                if mod.__dict__.get(fname) is shared.wrapper:
                    setattr(mod, fname, back)
            shared.places = []
            if hasattr(shared.wrapper, "__optwin_capture__"):
                del shared.wrapper.__optwin_capture__


# The capture's hold on torch.backends.mha's fast-path switch (process-wide, like the switch): the first
# capture to start saves the switch and turns it off, the last to stop, in whatever order they stop,
# puts the saved value back.
_FASTPATH_OFF = {"users": 0, "before": True}


def _fastpath_off() -> None:
    """Turn torch's MHA fast path off while a capture runs: nn.MultiheadAttention and
    nn.TransformerEncoderLayer in eval without autograd then run their Python slow path
    (F.multi_head_attention_forward: F.linear, sdpa, F.layer_norm), which the capture records; on the fast
    path a TransformerEncoder recorded 4 of its 8 matmuls and none of its attention, a bare
    MultiheadAttention nothing. The slow path computes the same ops (not bit-identical kernels)."""
    mha = getattr(torch.backends, "mha", None)
    if mha is None or not hasattr(mha, "set_fastpath_enabled"):  # older torch: the monitor's count remains
        return
    with _SHARED_LOCK:
        if _FASTPATH_OFF["users"] == 0:
            _FASTPATH_OFF["before"] = mha.get_fastpath_enabled()
            mha.set_fastpath_enabled(False)
        _FASTPATH_OFF["users"] += 1


def _fastpath_restore() -> None:
    mha = getattr(torch.backends, "mha", None)
    if mha is None or not hasattr(mha, "set_fastpath_enabled"):
        return
    with _SHARED_LOCK:
        _FASTPATH_OFF["users"] -= 1
        if _FASTPATH_OFF["users"] == 0:
            mha.set_fastpath_enabled(_FASTPATH_OFF["before"])


@contextmanager
def capture(model: nn.Module | None = None, *, sample_rate: float = 0.0, capacity: int = 4, seed: int = 0,
            ops: tuple[str, ...] | list[str] | None = None,
            module_variants: dict[Any, tuple[str, str]] | None = None,
            max_calls: int | None = None) -> Iterator[Recorder]:
    """Record catalog operator calls made inside the block; yields the Recorder.

    model: hooked for module paths (streams) and variant modules; None records torch functions
    only, with stream "". sample_rate/capacity/seed: tensor reservoir (see module docstring).
    ops: restrict to these ops. module_variants: {class or class name: (op, variant)} overrides
    for modules classify_module does not know (op must be "rmsnorm" or "rope-tables").
    max_calls: record only the first max_calls calls; later ones are counted in `skipped` (written
    to profile.json), so memory stays bounded (see the module docstring's Memory).
    """
    if not 0.0 <= sample_rate <= 1.0 or not math.isfinite(sample_rate):
        raise ValueError(f"sample_rate must be within [0, 1], got {sample_rate}")
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    if max_calls is not None and (isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1):
        raise ValueError(f"max_calls must be a whole number >= 1 or None, got {max_calls!r}")
    for op in ops or ():
        if op not in CATALOG:  # a misspelt op would record nothing, silently
            raise CatalogError(f"ops: unknown operator {op!r}; expected some of {', '.join(CATALOG)}")
    rec = Recorder(CaptureSettings(sample_rate, capacity, seed, tuple(ops) if ops is not None else None, max_calls))
    handles = _install_module_hooks(rec, model, dict(module_variants or {})) if model is not None else []
    undo = _patch_transformers(rec)
    _fastpath_off()
    try:
        with intercept.active(_Interceptor(rec), watched_targets(rec)):
            yield rec
    finally:
        _fastpath_restore()
        for h in handles:
            h.remove()
        _unpatch_transformers(undo)


# Methods whose `self` is never a model module: Recorder.stream's walk passes their frames without
# building their locals (optwin.monitor adds its own).
OWN_FRAMES: set[Any] = set()


def own_frames(*fns: Callable[..., Any]) -> None:
    """Mark the methods `fns` (on the path from an intercepted call to Recorder.stream) as the
    capture's own: the stream's frame walk skips them."""
    OWN_FRAMES.update(getattr(fn, "__func__", fn).__code__ for fn in fns)


own_frames(_Interceptor.handle, _Interceptor.run, Recorder.record)
