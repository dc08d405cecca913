"""A kernel launch without Triton's per-call binding: `launch(kernel, grid, *args, **kwargs)` does what
`kernel[grid](*args, **kwargs)` does, at a fraction of the host time once the call has been seen.

    from optwin.kernels.fast_launch import launch
    k = launch(_rmsnorm_kernel, (rows,), x, ..., BLOCK=4096, num_warps=8)   # returns the CompiledKernel

Why: an eager caller (a patched model decoding one token at a time) pays the host time of every launch,
and for small tensors that is the whole cost. On the H200's host, bf16 64x4096 (bench/launch_cost.py
--split): Triton's JIT call took 26-61 µs of it (binding ~30 arguments, specializing them, hashing the
cache key, checking the kernel's globals), its compiled kernel's bare launcher 7-10 µs.

How: the first call of each specialization goes through Triton (it compiles, launches, and returns
the CompiledKernel); later calls with the same key call CompiledKernel.run directly with the arguments
in signature order, as JITFunction.run does after its lookup. The key holds what Triton specializes on,
or more: each tensor's dtype and whether its address is 16-byte aligned, each int's type, whether it is
1 or divisible by 16 and whether it fits 32 bits, every other argument's value (constexprs, launch
options). A finer key only means more first calls, never a wrong kernel.
Falls back to Triton's own call under TRITON_INTERPRET=1, with a launch hook installed (profilers), and
for good once the direct call fails (another Triton whose launcher takes other arguments).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from triton.runtime import driver
from triton.runtime.jit import JITFunction

from optwin.kernels._common import INTERPRETED

try:
    from triton import knobs as _knobs
except ImportError:  # older Triton: no knobs module; launch hooks then go unseen, so keep its call
    _knobs = None

_PLANS: dict[tuple[Any, ...], Any] = {}  # key -> CompiledKernel
_PARAMS: dict[int, tuple[tuple[str, Any], ...]] = {}  # id(kernel) -> ((name, default), ...) in order
_state = {"direct": not INTERPRETED and _knobs is not None}


def _arg_key(v: Any) -> Any:
    """What Triton's specialization of one argument depends on (or more)."""
    if isinstance(v, torch.Tensor):
        return v.dtype, v.data_ptr() % 16 == 0
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return int, v == 1, v % 16 == 0, -(2**31) <= v < 2**31, v < 2**63
    if isinstance(v, float):
        return float
    return v  # constexprs, dtypes, strings: by value


def _params(kernel: JITFunction) -> tuple[tuple[str, Any], ...]:
    """(name, default) of the kernel's parameters in signature order (cached per kernel)."""
    got = _PARAMS.get(id(kernel))
    if got is None:
        got = tuple((p.name, p.default) for p in inspect.signature(kernel.fn).parameters.values())
        _PARAMS[id(kernel)] = got
    return got


def _hooked(hook: Any) -> bool:
    """A launch hook is installed: a plain callable (older Triton), or a HookChain with calls in it
    (Triton 3.5+ always holds a chain, empty unless a profiler adds to it)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def launch(kernel: JITFunction, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> Any:
    """kernel[grid](*args, **kwargs), returning the CompiledKernel; direct once the key was seen."""
    if not _state["direct"] or _hooked(_knobs.runtime.launch_enter_hook) or _hooked(_knobs.runtime.launch_exit_hook):
        return kernel[grid](*args, **kwargs)
    device = driver.active.get_current_device()  # Triton compiles and loads per current device
    key = (id(kernel), device, len(grid), *(_arg_key(a) for a in args),
           *((k, _arg_key(v)) for k, v in kwargs.items()))
    compiled = _PLANS.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)
        _PLANS[key] = compiled
        return compiled
    bound = list(args)
    for name, default in _params(kernel)[len(args):]:
        bound.append(kwargs.get(name, default))
    stream = driver.active.get_current_stream(device)
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    try:
        compiled.run(grid[0], g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None, *bound)
    except TypeError:  # a launcher of another signature: Triton's own call from now on
        _state["direct"] = False
        return kernel[grid](*args, **kwargs)
    return compiled
