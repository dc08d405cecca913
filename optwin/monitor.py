"""The in-process monitor: fault warnings for a running PyTorch model, before the faulting call.

    python -c "import torch, optwin.monitor as om; m = torch.nn.LayerNorm(8); \
print(om.monitor(m, db='fingerprints.duckdb'))"

    with optwin.monitor(model, db="fingerprints.duckdb", policy="warn") as mon:
        model(**batch)
    mon.warnings            # the warning events so far (also on logging 'optwin.monitor')

Interception reuses the capture hooks of optwin.ingest.capture (softmax, layer_norm, rms_norm, sdpa,
linear/matmul/addmm wrapped while the monitor runs, optwin.ingest.intercept; module hooks for
RMSNorm/T5LayerNorm modules; wrapped HF eager attention and rotary functions), with a Recorder whose
`record` checks the call instead of storing it. Unlike a capture, the monitor leaves torch's MHA fast
path on (nn.MultiheadAttention / nn.TransformerEncoderLayer in eval without autograd: fused C++ that none
of those wrappers sees); its calls are counted in `stats.skipped` and, by op and reason, in the
recorder's `skipped`, not checked. Each call site is a stream ("<module path>:<op>") with its own forecaster and dynamic
sampling (optwin.fingerprints.sampling): unsampled calls cost a counter increment, not a sketch.

Policies:
- "warn": never changes the model. Warnings go to logging ('optwin.monitor'), to callbacks and, with
  a sidecar, to the sidecar (which forecasts server-side). On CUDA the sketch is computed on the
  device, copied asynchronously into pinned host memory and queued with a CUDA event; it is read on
  a later call once the event has completed (`event.query()`), so the hot path never
  synchronizes. `flush()` drains the queue (waiting on the events).
- "fallback": when the call itself is predicted to fault (probability >= threshold), it runs in
  float32 and the result is cast back to the call's dtype (under torch.autocast, a matmul or attention
  whose autocast float16/bfloat16 is the fault keeps the float32 result). Applies to torch-function calls and to
  RMSNorm modules, and to the softmax of an eager attention patched with our kernels (run as float32
  torch.softmax instead of the kernel); wrapped HF functions (eager attention, rotary) otherwise only warn. Needs the verdict
  before the call, so it reads the sketch synchronously.
- "raise": raises FaultPredicted (an OptwinError) before the faulting call runs.
"raise"/"fallback" need a local database (db=...); a sidecar answers asynchronously.

On a model patched with our kernels (optwin.kernels.patch, in either order, nested), a "warn"
monitor takes the kernels' fused sketch (optwin.kernels.sketch_sink): a patched call asks the
monitor's sampling whether to launch with the sketch and hands over the buffer, and the monitor
sketches nothing itself. Those streams carry the variant the kernel runs ("triton"; rotary from HF's
tables "fp32-angles"). "fallback"/"raise" sketch the inputs before the call, as without the patch.
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
import types
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import nn

from optwin.catalog import CATALOG
from optwin.errors import CatalogError, OptwinError
import optwin.ingest as _ingest
from optwin.ingest import autocast_dtype as _autocast, intercept
from optwin.ingest.sketch import SKETCH_FEATURES, cap_features, sketch_tensor
from optwin.kernels import deferred, sketch_sink

# Importing the submodule binds it over the package's lazy `optwin.ingest.capture` function
# (the import system sets the parent attribute); put the public function back.
_cap = importlib.import_module("optwin.ingest.capture")
_ingest.capture = _cap.capture
_dtype_name = _cap._dtype_name

log = logging.getLogger("optwin.monitor")

POLICIES = ("warn", "fallback", "raise")
_UNSEEN = object()  # Monitor._sites: a call site not met yet
HOST_SLOTS = 256  # device sketches in flight at once (rows of the pinned host buffer)
_LOW = (torch.float16, torch.bfloat16)


class FaultPredicted(OptwinError):
    """policy="raise": the next call is predicted to fault; raised before it runs."""


@dataclass
class MonitorStats:
    calls: int = 0  # catalog calls seen
    checked: int = 0  # sampled, sketched and assessed
    skipped: int = 0  # sketch refused the call (shapes), dtype outside the catalog, or inside torch's MHA fast path
    queued: int = 0  # device sketches waiting for their event (CUDA, warn policy)
    fallbacks: int = 0
    raised: int = 0
    warnings: int = 0
    # With a sidecar: its client's counts of records (copied in whenever `Monitor.stats` is read; the sender
    # thread keeps them). Failures are also logged at WARNING on 'optwin.client', rate-limited.
    sidecar_sent: int = 0  # answered by the sidecar
    sidecar_failed: int = 0  # lost: sidecar unreachable, or it refused the request (HTTP 401: no or wrong token)
    sidecar_dropped: int = 0  # never sent: the client's queue was full (or the monitor stopped)
    sidecar_rejected: int = 0  # the sidecar was overloaded (HTTP 503)
    sidecar_errors: int = 0  # records the sidecar answered with an error


class _MonitorRecorder(_cap.Recorder):
    """A capture Recorder whose `record` checks the call (see Monitor)."""

    def __init__(self, mon: "Monitor") -> None:
        super().__init__(_cap.CaptureSettings(ops=mon.ops))
        self.mon = mon
        self.fallback_modules: set[int] = set()
        # "warn" reads verdicts after the call, so it can use the sketch a patched kernel makes in the
        # call; "fallback"/"raise" need it before the call and sketch the inputs themselves
        self.takes_fused = mon.policy == "warn"
        self._rope_tail: tuple[tuple[int, int | None, float], torch.Tensor] | None = None  # see rope_tail

    # -- optwin.kernels.sketch_sink.Sink: patched kernels hand over their fused sketch

    def wants(self, op: str, variant: str, dtype: torch.dtype, suffix: str = "") -> Any:
        # the sink is process-wide: a patched kernel called from another thread is not this monitor's call (its
        # samplers and pending queue are the owner thread's alone)
        if not self.here() or not self.watches(op):
            return None
        if self.foreign():  # another model's patched kernel, under its own monitor (capture's Recorder.foreign)
            return None
        site = f"{self.stream}:{suffix}" if suffix else self.stream
        return self.mon._sampled(op, variant, str(dtype).removeprefix("torch."), site)

    def take(self, token: Any, buf: torch.Tensor) -> None:
        self.mon._take_fused(self, token, buf)

    # Bumped whenever the rotary module's hook (capture) hands over positions, once per forward: the
    # rope_tail cache is keyed on it, so positions changed in place between forwards are seen even
    # where the version counter is not kept (inference tensors, torch.inference_mode).
    _pos_gen = 0
    _last_positions: torch.Tensor | None = None

    @property
    def last_positions(self) -> torch.Tensor | None:
        return self._last_positions

    @last_positions.setter
    def last_positions(self, pos: torch.Tensor | None) -> None:
        self._last_positions = pos
        self._pos_gen += 1

    def rope_tail(self, base: float) -> torch.Tensor:
        """(max |position|, base) as float64 on the positions' device: the rope features the tables
        do not carry. Made once per rotary-module call (every layer's q and k share it), by kernels:
        `t[1] = base` would copy a host scalar in, a sync. The version counter also catches an in-place
        change of the same positions without a new rotary call; inference tensors keep none (reading
        `_version` raises), so for them the rotary call alone decides."""
        pos = self.last_positions
        key = (self._pos_gen, None if torch.is_inference(pos) else pos._version, base)
        if self._rope_tail is None or self._rope_tail[0] != key:
            t = torch.empty(2, dtype=torch.float64, device=pos.device)
            t[0:1].copy_(pos.abs().amax().reshape(1))
            t[1:2].fill_(base)
            self._rope_tail = (key, t)
        return self._rope_tail[1]

    def skip(self, reason: str, n: int = 1) -> None:
        # calls the monitor cannot see (torch's MHA fast path, see capture._FASTPATH_CALLS) count in
        # stats.skipped too, where a monitor's user looks first
        super().skip(reason, n)
        self.mon._stats.skipped += n

    def record(self, op: str, variant: str, inputs: _cap.Inputs, params: dict[str, Any] | None = None,
               dtype: str | None = None, stream: str | None = None) -> None:
        if not self.watches(op):  # the monitor's `ops`: calls of other ops cost nothing
            return
        self.mon._check(self, op, variant, inputs, params or {}, dtype, self.stream if stream is None else stream)


class _MonitorInterceptor(_cap._Interceptor):
    """The capture's handling of intercepted torch calls, plus the policy's action: run the call in
    float32 (the handler set rec.action), or raise before it runs (FaultPredicted passes through)."""

    passes = (FaultPredicted,)

    def run(self, args: tuple, kwargs: dict, proceed: Callable[[tuple, dict], Any]) -> Any:
        act, self.rec.action = self.rec.action, None
        if act is not None:  # "fallback", or "fallback32": keep the rerun's float32 output
            return _in_float32(lambda *a, **k: proceed(a, k), args, kwargs, keep_float32=act == "fallback32")
        return proceed(args, kwargs)


_cap.own_frames(_MonitorInterceptor.run, _MonitorRecorder.record, _MonitorRecorder.wants)


def _in_float32(func: Callable, args: tuple, kwargs: dict, keep_float32: bool = False) -> Any:
    """Run func with its float16/bfloat16 tensors upcast; cast the output back to their dtype, or to the dtype
    the call asked for (softmax(x, dtype=torch.float32) keeps its float32 output). keep_float32: return the
    float32 output as it is (the call computes in float32, or autocast's lower precision is the fault).

    Under autocast the rerun runs with autocast off on the inputs' device: left on, F.linear/matmul/sdpa
    cast the upcast inputs straight back to float16 and the rerun overflowed like the call."""
    asked = kwargs.get("dtype")
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    low = asked if isinstance(asked, torch.dtype) else None
    if low is None and not keep_float32:
        low = next((a.dtype for a in tensors if a.dtype in _LOW), None)
    up = lambda a: a.float() if isinstance(a, torch.Tensor) and a.dtype in _LOW else a  # noqa: E731
    dev = tensors[0].device.type if tensors else None
    with _autocast.off(dev):
        out = func(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()})
    if low is None:
        return out
    if isinstance(out, torch.Tensor):
        return out.to(low)
    if isinstance(out, tuple):
        return type(out)(o.to(low) if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in out)
    return out


class Monitor:
    """Watches a model's catalog calls; a context manager (or start()/stop())."""

    def __init__(self, model: nn.Module | None = None, *, db: Any = None, sidecar: str | None = None,
                 policy: str = "warn", matcher: Any = None, token: str | None = None, sampling: Any = "default",
                 forecast: Any = None, variants: dict[str, str] | None = None,
                 callbacks: Iterable[Callable[[dict[str, Any]], None]] = (), ops: Iterable[str] | None = None,
                 async_readback: bool | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        from optwin.fingerprints.sampling import SamplingConfig

        if policy not in POLICIES:
            raise CatalogError(f"unknown monitor policy {policy!r}; expected one of {', '.join(POLICIES)}")
        if db is None and matcher is None and sidecar is None:
            raise CatalogError("monitor needs db=PATH (local matcher) or sidecar=URL")
        if policy != "warn" and db is None and matcher is None:
            raise CatalogError(f"policy {policy!r} needs a local database (db=...): a sidecar answers asynchronously")
        for op, v in (variants or {}).items():
            if op not in CATALOG:
                raise CatalogError(f"variants: unknown operator {op!r}")
            CATALOG[op].variant(v)
        for op in ops or ():
            if op not in CATALOG:  # a misspelt op would watch nothing, silently
                raise CatalogError(f"ops: unknown operator {op!r}; expected some of {', '.join(CATALOG)}")
        if not isinstance(sampling, (str, SamplingConfig)):
            raise CatalogError(f"sampling must be a preset name or a SamplingConfig, got {type(sampling).__name__}")
        self.model = model
        self.policy = policy
        self.variants = dict(variants or {})
        self.ops = tuple(ops) if ops is not None else None
        self.callbacks = list(callbacks)
        self.sampling = SamplingConfig.preset(sampling) if isinstance(sampling, str) else sampling
        self.forecast = forecast
        self.async_readback = async_readback
        self.clock = clock  # seconds, monotonic: the streams' time axis
        self.matcher = matcher
        if self.matcher is None and db is not None:
            from optwin.fingerprints.matcher import Matcher

            self.matcher = Matcher.open(db)
        self.client = None
        if sidecar is not None:
            from optwin.fingerprints.client import SidecarClient

            self.client = SidecarClient(sidecar, token=token, on_answer=self._sidecar_answer)
        self.streams: dict[tuple[str, str, str, str], Any] = {}
        # per stream key: the sidecar's last answer said warn (sender thread only)
        self._sidecar_warn: dict[tuple[Any, Any, Any, Any], bool] = {}
        # Sidecar verdicts (stream key, warn) for the streams' sampling, without a local matcher (whose
        # streams record their own verdicts). Appended by the client's sender thread, applied by the
        # model thread on its next call: Sampler is not thread-safe, and deque append/popleft are
        # atomic, so neither thread takes a lock.
        self._feedback: deque[tuple[tuple[Any, Any, Any, Any], bool]] = deque()
        self._sites: dict[tuple[str, str, str, str], Any] = {}  # (site, op, variant, dtype) -> stream, None: skipped
        self.warnings: list[dict[str, Any]] = []
        self.last_sketches: dict[tuple[str, str, str, str], dict[str, float]] = {}  # per stream key: the latest assessed
        self._stats = MonitorStats()
        # sketches in flight (async readback): (stream, names, host row, event or None on CPU, t, params, row)
        self._pending: deque[tuple[Any, tuple[str, ...], torch.Tensor, Any, float, dict, int]] = deque()
        self._host: torch.Tensor | None = None  # pinned (HOST_SLOTS, widest sketch) float64, on first use
        self._free: list[int] = []
        self._rec: _MonitorRecorder | None = None
        self._handles: list[Any] = []
        self._undo: list[Any] = []
        self._interceptor: _MonitorInterceptor | None = None
        self._targets: tuple[intercept.Target, ...] = ()

    @property
    def stats(self) -> MonitorStats:
        """The counters, with the sidecar client's send counts as they are now (the hot path counts into
        `_stats` and never touches the client's)."""
        s, c = self._stats, self.client
        if c is not None:
            cs = c.stats
            s.sidecar_sent, s.sidecar_failed, s.sidecar_dropped = cs.sent, cs.failed, cs.dropped
            s.sidecar_rejected, s.sidecar_errors = cs.rejected, cs.errors
        return s

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "Monitor":
        if self._interceptor is not None:  # a second start would drop the first one's hooks, never to be removed
            raise CatalogError("this monitor is already running: stop() it first, or start another Monitor")
        if self.client is not None and self.client.closed:  # stop() closed it: records would be dropped
            self.client.reopen()
        rec = self._rec = _MonitorRecorder(self)
        if self.model is not None:
            self._handles = _cap._install_module_hooks(rec, self.model, {})
            if self.policy == "fallback":
                self._handles += _install_module_fallback(rec, self.model)
        self._undo = _cap._patch_transformers(rec)
        self._interceptor = _MonitorInterceptor(rec)
        self._targets = _cap.watched_targets(rec)
        intercept.enter(self._interceptor, self._targets)
        if rec.takes_fused:
            sketch_sink.push(rec)
        return self

    def stop(self) -> None:
        if self._interceptor is None:
            return
        try:
            intercept.leave(self._interceptor, self._targets)
        finally:
            self._interceptor = None
            if self._rec is not None:
                sketch_sink.remove(self._rec)
            for h in self._handles:
                h.remove()
            _cap._unpatch_transformers(self._undo)  # the last user of a shared wrapper restores the original
            self._handles, self._undo = [], []
            self.flush()
            if self.client is not None:
                self.client.close()

    def __enter__(self) -> "Monitor":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_callback(self, fn: Callable[[dict[str, Any]], None]) -> None:
        self.callbacks.append(fn)

    # ------------------------------------------------------------------ the check

    def _stream(self, name: str, op: str, variant: str, dtype: str) -> Any:
        key = (name, op, variant, dtype)
        s = self.streams.get(key)
        if s is None:
            if self.matcher is not None:
                s = self.matcher.stream(name, op, variant, dtype, forecast=self.forecast, sampling=self.sampling)
            else:
                from optwin.fingerprints.sampling import Sampler

                s = types.SimpleNamespace(name=name, op=op, variant=variant, dtype=dtype, sampler=Sampler(self.sampling))
                s.should_check = s.sampler.should_check
            self.streams[key] = s
        return s

    def _sampled(self, op: str, variant: str, dt: str, site: str) -> Any:
        """The call's stream if its sampling picks this call for a sketch, else None."""
        self._stats.calls += 1
        deferred.settle_stale()  # deferred kernel sketches wait at most deferred.MAX_AGE_S for their page
        if self._pending:
            self._drain(block=False)
        if self._feedback:
            self._apply_feedback()
        key = (site, op, variant, dt)
        s = self._sites.get(key, _UNSEEN)  # every call: one lookup, no stream name built
        if s is _UNSEEN:
            s = self._sites[key] = (self._stream(f"{site}:{op}" if site else op, op, variant, dt)
                                    if dt in CATALOG[op].dtypes else None)
        if s is None:
            self._stats.skipped += 1  # e.g. float64 calls: not a catalog variant
            return None
        return s if s.should_check() else None

    def _apply_feedback(self) -> None:
        """Feed the sidecar's verdicts to the streams' samplers, as the local matcher's Stream does
        for its own (so a warning stream is checked more often, and bursts)."""
        fb, streams = self._feedback, self.streams
        while fb:
            key, warn = fb.popleft()
            s = streams.get(key)
            if s is not None:
                s.sampler.record(warn)

    def _check(self, rec: _MonitorRecorder, op: str, variant: str, inputs: _cap.Inputs,
               params: dict[str, Any], dtype: str | None, site: str) -> None:
        if dtype is None:  # only calls whose inputs are a dict come without one (the handlers name lazy ones')
            x = next(iter(inputs.values()))
            # Under autocast the call computes in autocast's dtype, not its inputs' (our kernels aside): labelled
            # float32, a float16 GEMM that overflows was looked up in float32's fingerprints and never warned.
            dtype = _cap._autocast_name(x, op) if op in _autocast.AFFECTED and variant != "triton" else _dtype_name(x)
        s = self._sampled(op, self.variants.get(op, variant), dtype, site)
        if s is None:
            return
        if callable(inputs):  # made only now that the call is sampled
            inputs = inputs()
        rec.suppress += 1  # the sketch's own torch calls are not calls to check
        try:
            with torch.no_grad():
                names, values = sketch_tensor(op, inputs, params)
        except Exception as e:  # noqa: BLE001  the sketch refused the call: count, never break the model
            rec.skip(f"{op}: {type(e).__name__}: {str(e)[:120]}")  # counts in stats.skipped too
            return
        finally:
            rec.suppress -= 1
        self._submit(rec, s, names, values, params)

    def _take_fused(self, rec: _MonitorRecorder, s: Any, buf: torch.Tensor) -> None:
        """A patched kernel's sketch buffer (the features in ingest's order, float64 on the device)."""
        params: dict[str, Any] = {}
        if s.op == "rope":  # from HF's tables: the positions and base come from the rotary module
            # capture's verdict on the rotary (a scaled rope_type, rounded frequencies, no base: not the catalog's
            # rope), as the unpatched path skips
            pos, base, reason = _cap.rope_table_of(rec, None)
            if pos is None:
                rec.skip("rope: positions unknown (no rotary-embedding module ran)")  # counts in stats.skipped too
                return
            if reason is not None or base is None:
                rec.skip(reason or "rope: base unknown")
                return
            with torch.no_grad():
                buf[8:10].copy_(rec.rope_tail(base))  # max_pos and base, device to device
            params = {"base": base}
        if deferred.pending(buf):  # a row launch whose finisher runs with its page (optwin.kernels.deferred)
            t = self.clock()  # the call's time, not the settle's
            deferred.when_settled(buf, lambda: self._submit(rec, s, SKETCH_FEATURES[s.op], buf, params, t))
            return
        self._submit(rec, s, SKETCH_FEATURES[s.op], buf, params)

    def _submit(self, rec: _MonitorRecorder, s: Any, names: tuple[str, ...], values: torch.Tensor,
                params: dict[str, Any], t: float | None = None) -> None:
        """Assess one sketched call (made at time t, default now) now, or queue it behind its device copy
        (warn on CUDA)."""
        op, variant, dt = s.op, s.variant, s.dtype
        self._stats.checked += 1
        t = self.clock() if t is None else t
        asyncr = self.async_readback if self.async_readback is not None else values.is_cuda
        if self.policy == "warn" and asyncr:
            # Copy into pinned host memory behind the sketch kernels; on CUDA the event marks the copy
            # done. Reading the row later is a CPU read: `.tolist()` on the device tensor would
            # instead wait for everything queued on the stream since (a hidden sync).
            event = None
            slot = self._host_slot()
            host = self._host[slot, : values.numel()]
            host.copy_(values, non_blocking=values.is_cuda)
            if values.is_cuda:
                event = torch.cuda.Event()  # per call: it records on the current device's stream
                event.record()
            self._pending.append((s, names, host, event, t, params, slot))
            self._stats.queued = len(self._pending)
            return
        r = self._assess(s, _features(names, values), t, params)
        if r is None or self.policy == "warn":
            return
        if r.max_probability >= self.matcher.config.threshold:
            msg = (f"{s.name}: {op}/{variant}/{dt} predicted to fault "
                   f"({', '.join(f'{k} p={v:.2f}' for k, v in r.probability.items())})")
            if self.policy == "raise":
                self._stats.raised += 1
                raise FaultPredicted(msg)
            self._stats.fallbacks += 1
            # The float32 rerun is cast back to the inputs' dtype, except where the call would not give that
            # dtype either: it computes in float32 (softmax/layer_norm under CUDA autocast), or autocast's lower
            # precision is the fault (matmul, attention), and casting back would overflow again. Autocast
            # regions mix float32 in as they are.
            keep32 = dt == "float32" or (op in _autocast.LOWER_PRECISION and _autocast.enabled())
            rec.action = "fallback32" if keep32 else "fallback"
            if rec.module is not None and op == "rmsnorm":
                rec.fallback_modules.add(id(rec.module))
            log.info("%s: running in float32", msg)

    def _assess(self, s: Any, sk: dict[str, float], t: float, params: dict[str, Any]) -> Any:
        self.last_sketches[(s.name, s.op, s.variant, s.dtype)] = sk
        if self.client is not None:
            self.client.observe(s.name, s.op, s.variant, s.dtype, sk, params=_jsonable(params), t=t)
        if self.matcher is None:
            return None
        r = s.observe_valid(sk, t)
        if r.raised:
            self._emit({"stream": s.name, "op": s.op, "variant": s.variant, "dtype": s.dtype, "t": t,
                        "probability": r.probability, "known": r.known, "eta_s": r.eta_s,
                        "reason": "risk" if r.max_probability >= self.matcher.config.threshold else "forecast",
                        "source": "local"})
        return r

    def _assess_oldest(self, block: bool) -> bool:
        """Assess the oldest queued sketch and free its host row; False, doing nothing, while its
        copy is still running (unless block: then wait for it)."""
        s, names, values, event, t, params, slot = self._pending[0]
        if event is not None:
            if not block and not event.query():
                return False
            if block:
                event.synchronize()
        self._pending.popleft()
        sk = _features(names, values)  # the host row is free once read
        self._free.append(slot)
        self._assess(s, sk, t, params)
        return True

    def _drain(self, block: bool) -> None:
        """Assess queued device sketches whose events completed (all of them when block)."""
        while self._pending and self._assess_oldest(block):
            pass
        self._stats.queued = len(self._pending)

    def _host_slot(self) -> int:
        """A free row of the pinned host buffer for one device sketch. Allocated once:
        a pinned allocation per call went through cudaHostAlloc whenever the caching host allocator
        had no block whose copy had completed (no change measured on the H200, bench/results/
        monitor_fused_h200_s16c.md, but no allocation in the hot path). With every row in flight, the
        oldest is drained (waited for) first."""
        if self._host is None:
            width = max(len(v) for v in SKETCH_FEATURES.values())
            pin = torch.cuda.is_available()  # pinned where a device copies into it
            self._host = torch.empty((HOST_SLOTS, width), dtype=torch.float64, pin_memory=pin)
            self._free = list(range(HOST_SLOTS))
        while not self._free:  # every row in flight: the oldest is waited for and assessed first
            self._assess_oldest(block=True)
        return self._free.pop()

    def flush(self) -> None:
        """Assess everything still queued, deferred kernel sketches too (synchronizes once on CUDA)."""
        deferred.settle_all()
        self._drain(block=True)
        if self.client is not None:
            self.client.flush()

    # ------------------------------------------------------------------ warnings

    def _sidecar_answer(self, ans: dict[str, Any]) -> None:
        """Every sidecar answer, on the client's sender thread. One event per episode, like local
        warnings: the sidecar's `warn` is the stream's warning state (hysteresis applied), so an
        episode opens at the first warn=True answer and ends at a warn=False one (which re-arms it:
        a stream that recovers and faults again warns again)."""
        key = (ans.get("stream"), ans.get("op"), ans.get("variant"), ans.get("dtype"))
        warn = bool(ans.get("warn"))
        last = self._sidecar_warn.get(key, False)
        self._sidecar_warn[key] = warn
        if self.matcher is None:
            self._feedback.append((key, warn))
        if warn and not last:
            self._emit({**ans, "source": "sidecar"})

    def _emit(self, w: dict[str, Any]) -> None:
        self._stats.warnings += 1
        self.warnings.append(w)
        log.warning("optwin: %s (%s/%s/%s) %s: %s, eta_s=%s", w.get("stream"), w.get("op"), w.get("variant"),
                    w.get("dtype"), w.get("reason", "warn"), w.get("probability"), w.get("eta_s"))
        for fn in self.callbacks:
            try:
                fn(w)
            except Exception:  # a broken callback must not break the model
                log.exception("monitor callback failed")


def _features(names: tuple[str, ...], values: torch.Tensor) -> dict[str, float]:
    """A sketch as {feature: float}, magnitudes clamped to FEATURE_CAP (cap_features) as
    optwin.fingerprints.matcher's call_sketch clamps what Stream.observe bins: a float64 input behind a float16
    call (softmax(x64, dtype=torch.float16)) can sketch past it or to inf, and observe_valid's log binning then
    raised OverflowError (the call went unassessed; from a queued sketch, out of flush()). Unlike call_sketch,
    a NaN is passed on, not refused (as torch.clamp did here before): the sketch is taken over finite elements,
    and reaching inf took an overflowing float64 sum, not a NaN."""
    return cap_features(dict(zip(names, values.tolist())))


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v)) for k, v in params.items()}


def _install_module_fallback(rec: _MonitorRecorder, model: nn.Module) -> list[Any]:
    """Forward hooks that recompute a flagged RMSNorm module in float32 and cast back."""
    handles = []
    for _, mod in model.named_modules():
        kind = _cap.classify_module(mod)
        if not kind or kind[0] != "rmsnorm":
            continue

        def post(m: nn.Module, args: tuple, out: Any) -> Any:
            # The flag was set by the owner thread's pre-hook (capture records only its calls): another
            # thread's call of the module, finishing in between, would take it and leave the owner's
            # faulting output as is.
            if not rec.here() or id(m) not in rec.fallback_modules or not args or not isinstance(out, torch.Tensor):
                return None
            rec.fallback_modules.discard(id(m))
            rec.suppress += 1  # the recomputation is not a new call
            try:
                with torch.no_grad() if not torch.is_grad_enabled() else torch.enable_grad():
                    return m.forward(args[0].float()).to(out.dtype)
            finally:
                rec.suppress -= 1

        handles.append(mod.register_forward_hook(post))
    return handles


def monitor(model: nn.Module | None = None, *, db: Any = None, sidecar: str | None = None, policy: str = "warn",
            **kwargs: Any) -> Monitor:
    """`optwin.monitor(model, db=... | sidecar=..., policy="warn"|"fallback"|"raise")`: a Monitor to use
    as a context manager (`with optwin.monitor(...) as mon:`) or with start()/stop()."""
    return Monitor(model, db=db, sidecar=sidecar, policy=policy, **kwargs)


class _CallableModule(types.ModuleType):
    """`import optwin.monitor` binds the module to `optwin.monitor`; calling it calls monitor()."""

    def __call__(self, *args: Any, **kwargs: Any) -> Monitor:
        return monitor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["monitor", "Monitor", "FaultPredicted", "MonitorStats", "POLICIES", "SKETCH_FEATURES"]
