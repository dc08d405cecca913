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
Off unless OPTWIN_FAST_LAUNCH=1 (see _state: one GPU check is unexplained). Falls back to Triton's own
call under TRITON_INTERPRET=1, without a GPU driver, with a launch hook installed (profilers), and
for good once the direct call fails (another Triton whose launcher takes other arguments).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch
from triton.runtime import driver
from triton.runtime.jit import JITFunction

from optwin.kernels._common import INTERPRETED

try:
    from triton import knobs as _knobs
except ImportError:  # older Triton: no knobs module; launch hooks then go unseen, so keep its call
    _knobs = None

_PLANS: dict[tuple[Any, ...], tuple[Any, tuple[tuple[str, Any], ...]]] = {}  # key -> (CompiledKernel, the rest)
MAX_PLANS = 4096
# Opt-in (OPTWIN_FAST_LAUNCH=1) until bench/softmax_long_check.py's 2x262144 rows are explained: in the one
# H200 run with the direct path on (bench/results/softmax_long_check_h200_s26.md) all 9 of them were off
# float64 in a few elements, y the same with and without the sketch; stop 24's run of the same check
# passed 27 of 27. The 2x262144 launches are the only ones whose first piece kernel ran direct on a plan
# from another shape (5x128256); Triton's own specialization of the two is the same (checked offline),
# so the cause is not yet known, and the device time to tell it from a stop-25 change ran out.
_state = {"direct": not INTERPRETED and _knobs is not None and os.environ.get("OPTWIN_FAST_LAUNCH") == "1"}
_driver: list[Any] = []  # (current device, current stream) of the active driver, bound on first use


def _arg_key(v: Any) -> Any:
    """What Triton's specialization of one argument depends on (or more). Exact types first: this runs
    for every argument of every launch."""
    t = type(v)
    if t is int:
        return v == 1, v & 15 == 0, -(2**31) <= v < 2**31, v < 2**63
    if t is torch.Tensor or isinstance(v, torch.Tensor):
        return v.dtype, v.data_ptr() & 15 == 0
    if t is float:
        return float
    return v  # bools, None, constexprs, dtypes, strings: by value


def _rest(kernel: JITFunction, n_args: int) -> tuple[tuple[str, Any], ...]:
    """(name, default) of the parameters after the first n_args, in signature order: the keyword
    arguments the launch passes by name or leaves at their defaults."""
    params = list(inspect.signature(kernel.fn).parameters.values())[n_args:]
    return tuple((p.name, p.default) for p in params)


def _hooked(hook: Any) -> bool:
    """A launch hook is installed: a plain callable (older Triton), or a HookChain with calls in it
    (Triton 3.5+ always holds a chain, empty unless a profiler adds to it)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def launch(kernel: JITFunction, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> Any:
    """kernel[grid](*args, **kwargs), returning the CompiledKernel; direct once the key was seen."""
    if not _state["direct"] or _hooked(_knobs.runtime.launch_enter_hook) or _hooked(_knobs.runtime.launch_exit_hook):
        return kernel[grid](*args, **kwargs)
    if not _driver:
        try:
            _driver.extend((driver.active.get_current_device, driver.active.get_current_stream))
        except RuntimeError:  # no GPU driver (an offline compile on a CPU machine): Triton's call decides
            _state["direct"] = False
            return kernel[grid](*args, **kwargs)
    device = _driver[0]()  # Triton compiles and loads per current device
    key = (id(kernel), device, len(grid), tuple(kwargs), *map(_arg_key, args), *map(_arg_key, kwargs.values()))
    plan = _PLANS.get(key)
    if plan is None:
        compiled = kernel[grid](*args, **kwargs)
        if len(_PLANS) >= MAX_PLANS:  # an argument keyed by value that changes every call: stay bounded
            _PLANS.clear()
        _PLANS[key] = (compiled, _rest(kernel, len(args)))
        return compiled
    compiled, rest = plan
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    try:
        compiled.run(grid[0], g1, g2, _driver[1](device), compiled.function, compiled.packed_metadata, None, None,
                     None, *args, *[kwargs.get(name, default) for name, default in rest])
    except TypeError:  # a launcher of another signature: Triton's own call from now on
        _state["direct"] = False
        return kernel[grid](*args, **kwargs)
    return compiled
