"""Intercept chosen torch functions while a capture or monitor is active in this thread.

    from optwin.ingest.intercept import Target, active
    with active(my_interceptor, targets):   # my_interceptor.handle(target, args, kwargs, proceed)
        model(x)

Each Target names a function by its owner and attribute (`torch.nn.functional.softmax`,
`torch.Tensor.__matmul__`, ...). While any interceptor is active, in any thread, the attribute holds
a wrapper; the wrapper looks up this thread's innermost interceptor and hands it the call, with a
`proceed(args, kwargs)` that runs the next interceptor out, and the original function last. Threads
without an interceptor, and calls once every interceptor has left, run the original directly (the
wrappers are removed when the last one leaves).

Why not a `torch.overrides.TorchFunctionMode`: a mode sees every torch call of the model (views,
reshapes, arithmetic: ~440 calls per forward of a 4-layer Llama), each through Python, where the
capture wants a dozen functions. On a small model on the CPU the mode cost 1.5 ms per forward, the
model itself 1.7 ms (bench/monitor_host.py). The price: a call site that bound a function before the
wrapper went in (`from torch.nn.functional import softmax` at import time) is not seen; transformers
and torch.nn look their functions up at call time.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol

import torch


class Target(NamedTuple):
    """A function to intercept: `getattr(owner, name)` when the first interceptor arrives."""

    owner: Any
    name: str
    op: str  # the catalog op its calls are recorded as
    handler: Callable[..., None]  # handler(recorder, args, kwargs)


class Interceptor(Protocol):
    def handle(self, target: Target, args: tuple, kwargs: dict, proceed: Callable[[tuple, dict], Any]) -> Any:
        """Everything about one call: record it, then `return proceed(args, kwargs)` (or not)."""


_LOCAL = threading.local()  # .stack: this thread's active interceptors, innermost last
_LOCK = threading.Lock()
_INSTALLED: dict[tuple[int, str], tuple[Any, Callable[..., Any], int]] = {}  # (owner, name) -> (owner, original, users)


def _stack() -> list[Interceptor]:
    s = getattr(_LOCAL, "stack", None)
    if s is None:
        s = _LOCAL.stack = []
    return s


def _run(stack: list[Interceptor], level: int, target: Target, original: Callable[..., Any],
         args: tuple, kwargs: dict) -> Any:
    """Hand the call to interceptor `level`; its proceed goes one level out, then to the original."""
    if level < 0:
        return original(*args, **kwargs)

    def proceed(a: tuple, k: dict) -> Any:
        return _run(stack, level - 1, target, original, a, k)

    return stack[level].handle(target, args, kwargs, proceed)


def current() -> list[Interceptor]:
    """This thread's active interceptors, outermost first (a copy)."""
    return list(getattr(_LOCAL, "stack", None) or ())


def _wrapper(target: Target, original: Callable[..., Any]) -> Callable[..., Any]:
    def call_original(a: tuple, k: dict) -> Any:  # the proceed of a lone interceptor: made once, not per call
        return original(*a, **k)

    def dispatch(args: tuple, kwargs: dict) -> Any:
        stack = getattr(_LOCAL, "stack", None)
        if not stack:  # another thread's capture installed us, or none is active here
            return original(*args, **kwargs)
        if len(stack) == 1:  # one capture or monitor (the usual case): no chain of proceeds to build
            return stack[0].handle(target, args, kwargs, call_original)
        return _run(list(stack), len(stack) - 1, target, original, args, kwargs)

    # Under torch.compile, dynamo must not trace the interceptors: it recorded FakeTensors (and the
    # recorder's records() then raised). This is eager_under_compile(dispatch, original) (see there),
    # written out because dispatch takes (args, kwargs) as they came: a dispatch(*args, **kwargs) that
    # the helper could call measured 0.1-0.3 us slower a call, on every call of every watched function.
    eager = _dynamo_disabled(dispatch)

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return eager(args, kwargs) if eager is not None else original(*args, **kwargs)
        return dispatch(args, kwargs)

    wrapped.__optwin_original__ = original  # type: ignore[attr-defined]
    return wrapped


_is_compiling = torch.compiler.is_compiling  # dynamo answers a call of it with the constant True


def _dynamo_disabled(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """fn with dynamo disabled, or None where dynamo is not imported (importing it costs seconds)."""
    if "torch._dynamo" not in sys.modules:
        return None
    return torch.compiler.disable(fn)  # no reason=: torch < 2.8 (pyproject allows 2.4) has no such keyword


def eager_under_compile(fn: Callable[..., Any], traced: Callable[..., Any]) -> Callable[..., Any]:
    """fn, run eagerly where torch.compile (dynamo) would trace it: a graph break, then fn on the real
    tensors. Traced, the capture's hooks and wrappers recorded FakeTensors from the recompile its hooks
    cause (records() then raised DataDependentOutputException). A disabled call costs ~0.7 us even in
    eager (it swaps dynamo's frame callback), so it is taken only while dynamo traces, where
    is_compiling() is the constant True (~0.15 us in eager). Where dynamo is not loaded yet (no
    transformers, no torch.compile before the capture began) there is nothing to disable with: a traced
    call then runs `traced` instead (for a hook: skip it; for a wrapper: run the original)."""
    under_compile = _dynamo_disabled(fn)
    if under_compile is None:
        under_compile = traced

    def eager_under_compile(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return under_compile(*args, **kwargs)
        return fn(*args, **kwargs)

    return eager_under_compile


def _install(targets: Sequence[Target]) -> None:
    with _LOCK:
        for t in targets:
            key = (id(t.owner), t.name)
            if key in _INSTALLED:
                owner, original, users = _INSTALLED[key]
                _INSTALLED[key] = (owner, original, users + 1)
                continue
            original = getattr(t.owner, t.name)
            _INSTALLED[key] = (t.owner, original, 1)
            setattr(t.owner, t.name, _wrapper(t, original))


def _uninstall(targets: Sequence[Target]) -> None:
    with _LOCK:
        for t in targets:
            key = (id(t.owner), t.name)
            owner, original, users = _INSTALLED[key]
            if users > 1:
                _INSTALLED[key] = (owner, original, users - 1)
            else:
                del _INSTALLED[key]
                setattr(owner, t.name, original)


def enter(interceptor: Interceptor, targets: Sequence[Target]) -> None:
    """Make `interceptor` this thread's innermost one (wrapping `targets` if not yet wrapped)."""
    _install(targets)
    _stack().append(interceptor)


def leave(interceptor: Interceptor, targets: Sequence[Target]) -> None:
    """Undo enter(interceptor, targets) (interceptors may leave out of order)."""
    s = _stack()
    for i in range(len(s) - 1, -1, -1):
        if s[i] is interceptor:
            del s[i]
            break
    _uninstall(targets)


@contextmanager
def active(interceptor: Interceptor, targets: Sequence[Target]) -> Iterator[None]:
    enter(interceptor, targets)
    try:
        yield
    finally:
        leave(interceptor, targets)


def original(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function a wrapper stands for (fn itself when it is not one)."""
    return getattr(fn, "__optwin_original__", fn)
