"""Launch plans: what a launcher works out from a call's shapes, strides, dtypes and options (the kernel,
its grid, its constexprs and launch options), worked out once per such key and kept, so a later call with
the same key pays only for its tensors and the launch.

    plan = launch_plan.kept(key) or _rmsnorm_plan(...)   # the launcher's own config code, on a miss
    launch_plan.run(key, plan, args)                     # fast_launch.launch_keyed under the same key

Why: an eager caller (a patched model decoding a token at a time) pays every launch's host time, and for
small tensors that is the whole cost. Before plans, the launchers' config code (launch_config, strides'
common multiple, prefetch depth, occupancy lookups) and fast_launch's full specialization key (~6 µs) ran
on every call. H200 host, µs a launch through fast_launch before / after, in one run (bench/launch_cost.py,
bench/results/launch_cost_plans_h200_s41.md), without / with the sketch: rmsnorm 47.8 / 53.0 -> 21.6 / 23.9,
layernorm 45.0 / 56.9 -> 26.5 / 30.9, softmax 63.8 / 68.6 -> 23.7 / 25.7, rope 71.8 / 74.3 -> 40.0 / 41.8.

The key must hold everything the plan reads: the op, the shapes and row strides, where in 16 bytes the
rows' data starts (the L2 prefetch, softmax's packed and windowed rows read it), every tensor argument's
dtype, the device, whether the sketch is on, and the launcher's overrides. It is also fast_launch's key
(with the tensors' 16-byte alignment added per call), so it must fix every int argument and every
constexpr.

A plan is kept once it is final: its grid and prefetch depth read the kernel's recorded occupancy
(_common.note_occupancy, after the kernel's first launch), so a plan built before that is used once and
built again. Plans read the tuning tables (_common.TUNED, PREFETCH, ROW_GRID, ...) when they are built:
code that changes a table at run time calls clear() after.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, NamedTuple

from optwin.kernels import _common
from optwin.kernels.fast_launch import launch_keyed

MAX_KEPT = 1024  # distinct keys kept (a shape that changes every call, e.g. a growing KV length, stays bounded)
_KEPT: dict[Hashable, Plan] = {}


class Plan(NamedTuple):
    kernel: Any  # the JITFunction
    grid: tuple[int, ...]
    options: dict[str, Any]  # constexprs and launch options, by name
    occupancy: tuple[Any, ...]  # note_occupancy's key of the launch
    warps: int
    final: bool  # the occupancy the grid and prefetch read was recorded when the plan was built
    extra: tuple[Any, ...] = ()  # what else the launcher derives once (its own order)


def plan(kernel: Any, grid: tuple[int, ...], options: dict[str, Any], occupancy: tuple[Any, ...],
         warps: int, extra: tuple[Any, ...] = ()) -> Plan:
    """A Plan, final if `occupancy` (the launch's note_occupancy key) is already recorded."""
    return Plan(kernel, grid, options, occupancy, warps, occupancy in _common._OCCUPANCY, extra)


def kept(key: Hashable) -> Plan | None:
    """The plan kept under `key`, or None (build it)."""
    return _KEPT.get(key)


def run(key: Hashable, p: Plan, args: tuple[Any, ...], kept_as: tuple[Hashable, Plan] | None = None) -> Any:
    """Launch `p` with the call's positional `args` (fast_launch keyed by `key`); a plan not kept yet
    records the kernel's occupancy and is kept if final. kept_as: the (key, plan) the launcher looks up,
    where that plan holds `p` (softmax's deferred form) rather than being it. Returns the CompiledKernel
    (None from the interpreter)."""
    # a plan built before its occupancy was known may carry other runtime values (a prefetch distance) than
    # the final one of the same key: fast_launch binds a key's values once, so the two keep apart
    k = launch_keyed(key if p.final else (key, "unsettled"), p.kernel, p.grid, args, p.options)
    kkey, kp = kept_as or (key, p)
    if _KEPT.get(kkey) is not kp:
        _common.note_occupancy(p.occupancy, k, p.warps)
        if kp.final:
            if len(_KEPT) >= MAX_KEPT:
                _KEPT.clear()
            _KEPT[kkey] = kp
    return k


def clear() -> None:
    """Forget every plan (after a tuning table changed at run time)."""
    _KEPT.clear()
