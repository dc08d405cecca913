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
or more: constexpr parameters and launch options by value; for the runtime arguments each tensor's
dtype and whether its address is 16-byte aligned, each int's type, whether it is 1 or divisible by 16
and whether it fits 32 bits, every other argument's value. A finer key only means more first calls,
never a wrong kernel. H200 hosts, per launch, direct / Triton's call: 54-78 / 69-105 µs without the
sketch, 59-79 / 77-109 µs with it on one (bench/results/launch_cost_h200_s26c.md); 28-34 / 37-52 and
30-35 / 41-55 on a faster one (launch_cost_h200_s27_fastlaunch.md).
launch_keyed does the same under a key the caller vouches for (optwin.kernels.launch_plan's: it fixes
everything but the tensors' alignment), so a launch skips the full key (~6 µs on the CI machine).
On by default; OPTWIN_FAST_LAUNCH=0 turns it off (see _state). Falls
back to Triton's own call under TRITON_INTERPRET=1, without a GPU driver, with a launch hook installed
(profilers), and for good once the direct call fails (another Triton whose launcher takes other
arguments).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from triton.runtime import driver
from triton.runtime.jit import JITFunction

from optwin.kernels._common import INTERPRETED

try:
    from triton import knobs as _knobs
except ImportError:  # older Triton: no knobs module; launch hooks then go unseen, so keep its call
    _knobs = None

# key -> (CompiledKernel, the parameters after the positional ones: (name, default) pairs, or under a plan
# key (launch_keyed) their values)
_PLANS: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = {}
_TENSORS_AT: dict[Any, tuple[int, ...]] = {}  # plan key -> positions of its tensor arguments
MAX_PLANS = 4096
# On unless OPTWIN_FAST_LAUNCH=0. Its first H200 run with the direct path on (bench/results/
# softmax_long_check_h200_s26.md) failed all 9 checks at 2x262144: the key then took every int by its
# specialization class, constexprs too, so PIECES=64 (2x262144) found the plan compiled at PIECES=32
# (5x128256) and half of each row's pieces went unread. Constexprs and launch options are now keyed by
# value (_key); tests/test_kernels_fast_launch.py checks that equal keys mean equal Triton specializations
# over every launch our launchers make, and the H200 checks pass with it (bench/results/*_h200_s27_fastlaunch.md).
_state = {"direct": not INTERPRETED and _knobs is not None and os.environ.get("OPTWIN_FAST_LAUNCH", "1") != "0"}
_SIGS: dict[int, Any] = {}  # id(kernel) -> _Signature
_driver: list[Any] = []  # (current device, current stream) of the active driver, bound on first use


@contextlib.contextmanager
def direct(on: bool) -> Iterator[None]:
    """The direct path on or off within the block, whatever OPTWIN_FAST_LAUNCH set, then as before
    (benches time both in the same rounds). On still falls back where launch() falls back."""
    before = _state["direct"]
    _state["direct"] = on
    try:
        yield
    finally:
        _state["direct"] = before


def _arg_key(v: Any) -> Any:
    """What Triton's specialization of one runtime argument depends on (or more). Exact types first: this
    runs for every argument of every launch."""
    t = type(v)
    if t is int:
        return v == 1, v & 15 == 0, -(2**31) <= v < 2**31, v < 2**63
    if t is torch.Tensor or isinstance(v, torch.Tensor):
        return v.dtype, v.data_ptr() & 15 == 0
    if t is float:
        return float
    return v  # bools, None, dtypes, strings: by value


class _Signature(NamedTuple):
    """A kernel's parameters as the key and the bound call need them."""

    constexpr: tuple[bool, ...]  # per parameter, in signature order
    names: dict[str, int]  # parameter name -> position
    defaults: tuple[Any, ...]  # per parameter (inspect.Parameter.empty where none)


def _signature(kernel: JITFunction) -> _Signature:
    """The kernel's _Signature, cached per kernel."""
    sig = _SIGS.get(id(kernel))
    if sig is None:
        params = list(inspect.signature(kernel.fn).parameters.values())
        # Triton's own reading where it has one (JITFunction.params); the interpreter's wrapper has none:
        # the annotation, as Triton reads it
        by_name = {p.name: p.is_constexpr for p in getattr(kernel, "params", ())}
        flags = tuple(by_name.get(p.name, "constexpr" in str(p.annotation)) for p in params)
        sig = _Signature(flags, {p.name: i for i, p in enumerate(params)},
                         tuple(p.default for p in params))
        _SIGS[id(kernel)] = sig
    return sig


def _key(kernel: JITFunction, device: int, grid: tuple[int, ...], args: tuple[Any, ...], kwargs: dict[str, Any]):
    """The plan's key: constexprs and launch options by value (each value is its own kernel), runtime
    arguments by what Triton specializes them on (_arg_key)."""
    sig = _signature(kernel)
    flags = sig.constexpr
    key = [id(kernel), device, len(grid)]
    key += [a if c else _arg_key(a) for a, c in zip(args, flags)]
    for name, v in kwargs.items():
        at = sig.names.get(name)
        key.append((name, _arg_key(v) if at is not None and not flags[at] else v))
    return tuple(key)


def _rest(kernel: JITFunction, n_args: int) -> tuple[tuple[str, Any], ...]:
    """(name, default) of the parameters after the first n_args, in signature order: the keyword
    arguments the launch passes by name or leaves at their defaults."""
    sig = _signature(kernel)
    return tuple(zip(list(sig.names)[n_args:], sig.defaults[n_args:]))  # names: in signature order


def _hooked(hook: Any) -> bool:
    """A launch hook is installed: a plain callable (older Triton), or a HookChain with calls in it
    (Triton 3.5+ always holds a chain, empty unless a profiler adds to it)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def launch(kernel: JITFunction, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> Any:
    """kernel[grid](*args, **kwargs), returning the CompiledKernel; direct once the key was seen."""
    return launch_keyed(None, kernel, grid, args, kwargs)


def launch_keyed(plan_key: Any, kernel: JITFunction, grid: tuple[int, ...], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
    """launch(kernel, grid, *args, **kwargs) keyed by `plan_key` and the tensors' 16-byte alignment instead of
    the full key (_key, ~6 µs a launch on the CI machine). plan_key must fix everything else Triton
    specializes on: the kernel, grid, options, every int and every tensor's dtype (optwin.kernels.launch_plan's
    key: the shapes, strides, dtypes and options of the call). None: the full key."""
    if not _state["direct"] or _hooked(_knobs.runtime.launch_enter_hook) or _hooked(_knobs.runtime.launch_exit_hook):
        return kernel[grid](*args, **kwargs)
    if not _driver:
        try:
            _driver.extend((driver.active.get_current_device, driver.active.get_current_stream))
        except RuntimeError:  # no GPU driver (an offline compile on a CPU machine): Triton's call decides
            _state["direct"] = False
            return kernel[grid](*args, **kwargs)
    device = _driver[0]()  # Triton compiles and loads per current device
    if plan_key is None:
        key = _key(kernel, device, grid, args, kwargs)
    else:  # a plan's arguments keep their kinds: where its tensors sit is found once
        at = _TENSORS_AT.get(plan_key)
        if at is None:
            at = _TENSORS_AT[plan_key] = tuple(j for j, a in enumerate(args) if isinstance(a, torch.Tensor))
        key = (plan_key, device, *[args[j].data_ptr() & 15 == 0 for j in at])
    plan = _PLANS.get(key)
    if plan is None:
        compiled = kernel[grid](*args, **kwargs)
        if len(_PLANS) >= MAX_PLANS:  # an argument keyed by value that changes every call: stay bounded
            _PLANS.clear()
            _TENSORS_AT.clear()
        rest = _rest(kernel, len(args))
        # under a plan key the keywords are the plan's options, the same every call: their values bound once
        _PLANS[key] = (compiled, rest if plan_key is None else tuple(kwargs.get(n, d) for n, d in rest))
        return compiled
    compiled, rest = plan
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    tail = rest if plan_key is not None else [kwargs.get(name, default) for name, default in rest]
    try:
        compiled.run(grid[0], g1, g2, _driver[1](device), compiled.function, compiled.packed_metadata, None, None,
                     None, *args, *tail)
    except TypeError:  # a launcher of another signature: Triton's own call from now on
        _state["direct"] = False
        return kernel[grid](*args, **kwargs)
    return compiled
