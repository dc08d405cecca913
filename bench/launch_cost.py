"""Host cost of one kernel launch, with and without the sketch, side by side in interleaved rounds:
what an eager (not graph-captured) caller pays in Python and the driver before the GPU sees the kernel.
When it exceeds the GPU time queued ahead of a launch (do_bench's 256 MB L2 flush, ~70 µs on the H200),
it shows up as kernel time in do_bench; BENCH_METHOD=flush_sleep of bench/norm_chunks.py hides it.

    python bench/launch_cost.py            # on a CUDA machine; writes $OUT/launch_cost.md
    BENCH_SHAPE=64x4096 python bench/launch_cost.py
    python bench/launch_cost.py --profile  # also cProfile each sketched launch: where the host time goes
    python bench/launch_cost.py --split    # also each launch's own parts: Triton's JIT call alone, the bare launcher
    python bench/launch_cost.py --host     # any machine, no GPU: our host code (Triton's compile, driver left out)
    BENCH_AB=base python bench/launch_cost.py [--host]   # ... beside a frozen package (bench/ab_snapshot.py)

Each entry: µs of host wall time per call over CALLS launches back to back, through
optwin.kernels.fast_launch and through Triton's own call (fast_launch off) (the GPU queue never
fills: the launches are small), median over ROUNDS interleaved rounds. Launch = the bench's launcher
(bench/gpu_kernels.py OPS: the op's `_*_launch` into given buffers); torch eager of the production
variant beside it for scale.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/

import torch
from _bench_common import write_report
from gpu_kernels import OPS

from optwin.kernels import fast_launch

SHAPE = tuple(int(v) for v in os.environ.get("BENCH_SHAPE", "64x4096").split("x"))
ROUNDS, CALLS = 7, 200


# The kernel modules whose launchers call fast_launch.launch (and check_device)
KERNEL_MODULES = ("rmsnorm", "layernorm", "layernorm_welford", "softmax", "softmax_long", "softmax_rows", "rope",
                  "attention")


@contextlib.contextmanager
def kernel_calls_replaced(call, pkgs=("optwin",)):
    """Within the block, every launcher of `pkgs` calls `call(kernel, grid, *args, **kwargs)` instead of
    launching, and skips its device check (CPU tensors); both are put back after (tests run this in
    their process)."""
    saved = []
    for pkg in pkgs:
        plans = importlib.import_module(f"{pkg}.kernels.launch_plan") if importlib.util.find_spec(
            f"{pkg}.kernels.launch_plan") else None  # frozen packages from before launch plans have none
        if plans is not None:  # the launchers that run a launch_plan.Plan
            saved.append((plans, "launch_keyed", plans.launch_keyed))
            plans.launch_keyed = lambda key, kernel, grid, args, kwargs: call(kernel, grid, *args, **kwargs)
        for m in KERNEL_MODULES:
            mod = importlib.import_module(f"{pkg}.kernels.{m}")
            for attr, value in (("launch", call), ("check_device", lambda *t: None)):
                if hasattr(mod, attr):
                    saved.append((mod, attr, getattr(mod, attr)))
                    setattr(mod, attr, value)
    try:
        yield
    finally:
        for mod, attr, value in saved:
            setattr(mod, attr, value)


def host_us(fn) -> float:
    """µs of host time per call of fn, CALLS calls back to back, then one sync (not timed)."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(CALLS):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return 1e6 * dt / CALLS


def main() -> str:
    """Host µs per launch on a GPU: the live package and BENCH_AB's frozen ones (bench/ab_snapshot.py), each
    through its fast_launch and through Triton's own call, torch eager beside them, in interleaved rounds."""
    from gpu_kernels import _sweep_launcher

    sys.path.insert(0, str(Path(__file__).resolve().parent / ".ab"))
    pkgs = ["optwin", *(f"optwin_{n}" for n in os.environ.get("BENCH_AB", "").split(",") if n)]
    g = torch.Generator().manual_seed(0)
    entries = {}
    for name in ("rmsnorm", "layernorm", "softmax", "rope"):
        b = OPS[name]
        inp, params = b.make(SHAPE, torch.bfloat16, "cuda", g)
        if name != "rope":  # the launchers take rows
            inp = {k: (v.reshape(-1, v.shape[-1]) if k == "x" else v) for k, v in inp.items()}
        y = torch.empty_like(inp["x"])
        for pkg in pkgs:
            buf = importlib.import_module(f"{pkg}.kernels.sketch_buffer").new_buffer(b.op, "cuda")
            f = _sweep_launcher(name, inp, params, y, {"pkg": pkg})
            entries[(name, pkg, "no sketch")] = lambda f=f: f(None)
            entries[(name, pkg, "sketch")] = lambda f=f, buf=buf: f(buf)
        entries[(name, "torch", "torch eager")] = lambda b=b, inp=inp, params=params: b.eager(inp, params)
    for fn in entries.values():  # compile and warm up
        fn()
        fn()
    res: dict[tuple[str, str, str, bool], list[float]] = {}
    for _ in range(ROUNDS):
        for (name, pkg, kind), fn in entries.items():
            for direct in (True, False) if pkg != "torch" else (True,):
                fl = importlib.import_module(f"{pkg if pkg != 'torch' else 'optwin'}.kernels.fast_launch")
                with fl.direct(direct):
                    res.setdefault((name, pkg, kind, direct), []).append(host_us(fn))
    lines = [f"# Host µs per launch, bf16 {SHAPE[0]}x{SHAPE[1]}; {torch.cuda.get_device_name()}, {ROUNDS} interleaved "
             f"rounds of {CALLS} calls", "", "optwin.kernels.fast_launch (Triton's own `kernel[grid](...)` call in brackets)",
             "", "| op | package | no sketch | sketch | sketch - no sketch | torch eager |", "|---|---|---:|---:|---:|---:|"]
    for name in ("rmsnorm", "layernorm", "softmax", "rope"):
        eager = statistics.median(res[(name, "torch", "torch eager", True)])
        for pkg in pkgs:
            m = {(w, d): statistics.median(v) for (n, p, w, d), v in res.items() if n == name and p == pkg}
            cells = [f"{m[(w, True)]:.1f} ({m[(w, False)]:.1f})" for w in ("no sketch", "sketch")]
            diff = m[("sketch", True)] - m[("no sketch", True)]
            lines.append(f"| {name} | {pkg} | {cells[0]} | {cells[1]} | {diff:+.1f} | {eager:.1f} |")
    live = {(name, kind): fn for (name, pkg, kind), fn in entries.items() if pkg in ("optwin", "torch")}
    if "--split" in sys.argv:
        lines += ["", *split(live)]
    if "--profile" in sys.argv:
        lines += ["", *profiles(live)]
    return "\n".join(lines) + f"\n\ntorch {torch.__version__}\n"


def split(entries) -> list[str]:
    """Per launch: the whole launcher, then the same kernel call replayed through Triton's JIT (`kernel[grid](...)`
    with the launcher's arguments), then the compiled kernel's bare launcher (`CompiledKernel.run`, what is
    left once the arguments are bound and the kernel is looked up)."""
    import inspect

    from triton.runtime.jit import JITFunction

    rows = ["| launch | launcher | JIT call only | bare launcher |", "|---|---:|---:|---:|"]
    for (name, kind), fn in entries.items():
        if kind == "torch eager":
            continue
        seen = {}

        def intercept(self, *args, grid, warmup, **kwargs):
            seen.update(fn=self, args=args, kwargs=kwargs, grid=grid)
            return saved(self, *args, grid=grid, warmup=warmup, **kwargs)

        saved = JITFunction.run
        JITFunction.run = intercept
        try:
            with fast_launch.direct(False):  # the call must reach JITFunction.run to be seen
                fn()
        finally:
            JITFunction.run = saved
        jf, args, kwargs, grid = seen["fn"], seen["args"], seen["kwargs"], seen["grid"]
        kernel = jf[grid](*args, **kwargs)
        bound = [*args] + [kwargs.get(name, default) for name, default in fast_launch._rest(jf, len(args))]
        g = tuple(grid) + (1,) * (3 - len(grid))
        stream = torch.cuda.current_stream().cuda_stream
        if inspect.Parameter.empty not in bound:
            bare = lambda: kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata, None,  # noqa: E731
                                      None, None, *bound)
            bare()
            t_bare = f"{statistics.median(host_us(bare) for _ in range(ROUNDS)):.1f}"
        else:  # defaulted arguments the launcher did not pass: the bare call would need their values
            t_bare = "n/a"
        t_jit = statistics.median(host_us(lambda: jf[grid](*args, **kwargs)) for _ in range(ROUNDS))
        t_all = statistics.median(host_us(fn) for _ in range(ROUNDS))
        rows.append(f"| {name}, {kind} | {t_all:.1f} | {t_jit:.1f} | {t_bare} |")
    return ["## Where a launch's host time goes (µs)", "", *rows]


def profiles(entries) -> list[str]:
    """Each sketched launch under cProfile (CALLS calls): the functions with the most own time."""
    import cProfile
    import io
    import pstats

    out = []
    for (name, kind), fn in entries.items():
        if kind == "torch eager":
            continue
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(CALLS):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        out += [f"## {name}, {kind}: cProfile, {CALLS} calls, by own time", "", "```", text.getvalue().strip(), "```", ""]
    return out


class _NoKernel:
    """What Triton's call returns under triton_left_out: a CompiledKernel whose launcher does nothing."""

    n_regs, function, packed_metadata, metadata = 0, None, None, None  # no counts: the default occupancy

    def run(self, *args: Any) -> None:
        return None


@contextlib.contextmanager
def triton_left_out(pkgs=("optwin",)):
    """Within the block our launchers run as on a GPU, through fast_launch's direct path, but Triton's own
    call (the compile on a key's first launch) returns a _NoKernel whose launcher does nothing, and the
    device checks pass CPU tensors: what is timed is our host code, the launchers and fast_launch's
    lookup, without the driver's launch. Everything is put back after (tests run this in their process)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def no_kernel(self, *args, grid, warmup, **kwargs):
        return _NoKernel()

    saved = [(cls, "run", cls.run) for cls in (JITFunction, InterpretedFunction)]
    for cls, _, _ in saved:
        cls.run = no_kernel
    states = []
    for pkg in pkgs:
        fl = importlib.import_module(f"{pkg}.kernels.fast_launch")
        states.append((fl, dict(fl._state), list(fl._driver)))
        fl._state["direct"] = True
        fl._driver[:] = [lambda: 0, lambda device: 0]
        for m in KERNEL_MODULES:
            mod = importlib.import_module(f"{pkg}.kernels.{m}")
            if hasattr(mod, "check_device"):
                saved.append((mod, "check_device", mod.check_device))
                mod.check_device = lambda *t: None
    try:
        yield
    finally:
        for obj, attr, value in saved:
            setattr(obj, attr, value)
        for fl, state, drv in states:
            fl._state.update(state)
            fl._driver[:] = drv
            fl._PLANS.clear()  # no _NoKernel stays behind


def host_only() -> str:
    """Our host code per launch (CPU tensors, no GPU needed): the launchers and fast_launch's direct path,
    with Triton's compile and the driver's launch left out (triton_left_out): configs, grids,
    workspaces, occupancy, the launch plans and fast_launch's key. The driver's part is --split's
    column on a GPU. BENCH_AB=name,...: frozen packages (bench/ab_snapshot.py) timed in the same
    interleaved rounds."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / ".ab"))
    pkgs = ["optwin", *(f"optwin_{n}" for n in os.environ.get("BENCH_AB", "").split(",") if n)]
    with triton_left_out(pkgs):
        return _host_table(pkgs)


def _host_table(pkgs: list[str]) -> str:
    """host_only's rounds and table, with Triton's part already left out."""
    from gpu_kernels import _sweep_launcher

    g = torch.Generator().manual_seed(0)
    entries = {}
    for name in ("rmsnorm", "layernorm", "softmax", "rope"):
        b = OPS[name]
        inp, params = b.make(SHAPE, torch.bfloat16, "cpu", g)
        if name != "rope":
            inp = {k: (v.reshape(-1, v.shape[-1]) if k == "x" else v) for k, v in inp.items()}
        y = torch.empty_like(inp["x"])
        for pkg in pkgs:
            buf = importlib.import_module(f"{pkg}.kernels.sketch_buffer").new_buffer(b.op, "cpu")
            f = _sweep_launcher(name, inp, params, y, {"pkg": pkg})
            for sk in (False, True):
                entries[(name, pkg, sk)] = (lambda f=f, bb=buf if sk else None: f(bb))
    res = _interleaved_us(entries)
    lines = [f"# Our host µs per launch (launcher and fast_launch; Triton's compile and the driver's launch left out), "
             f"bf16 {SHAPE[0]}x{SHAPE[1]}, CPU tensors; "
             f"median of {ROUNDS} interleaved rounds of {CALLS} calls", "",
             "| op | " + " | ".join(f"{p} no sketch | {p} sketch" for p in pkgs) + " |", "|---|" + "---:|" * (2 * len(pkgs))]
    for name in ("rmsnorm", "layernorm", "softmax", "rope"):
        cells = [f"{statistics.median(res[(name, p, sk)]):.1f}" for p in pkgs for sk in (False, True)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + _deferred_rows()) + f"\n\ntorch {torch.__version__}\n"


def _interleaved_us(entries: dict[Any, Callable[[], Any]]) -> dict[Any, list[float]]:
    """Host µs per call of each entry: one warm call each, then ROUNDS interleaved rounds of CALLS calls."""
    for fn in entries.values():
        fn()
    res: dict[Any, list[float]] = {k: [] for k in entries}
    for _ in range(ROUNDS):
        for k, fn in entries.items():
            t = time.perf_counter()
            for _ in range(CALLS):
                fn()
            res[k].append(1e6 * (time.perf_counter() - t) / CALLS)
    return res


def _deferred_rows() -> list[str]:
    """The live package's row launches that defer (softmax's at bf16 rows of 16384: a program per row; layernorm's
    Welford launch at rows of 4096) without the sketch, with their finisher in the launch and deferred
    (optwin.kernels.deferred: the page's reservations, the lock, and the settle's host part, once every PAGE_CALLS
    calls), host µs per call in interleaved rounds."""
    from optwin.kernels import deferred
    from optwin.kernels.layernorm import EPS, _layernorm_launch
    from optwin.kernels.sketch_buffer import new_buffer
    from optwin.kernels.softmax import _softmax_launch

    xs = torch.randn(SHAPE[0], 16384).to(torch.bfloat16)
    ys = torch.empty_like(xs)
    xl = torch.randn(SHAPE[0], 4096).to(torch.bfloat16)
    yl, w, b = torch.empty_like(xl), torch.ones(4096, dtype=torch.bfloat16), torch.zeros(4096, dtype=torch.bfloat16)
    bs, bl = new_buffer("softmax", "cpu"), new_buffer("layernorm", "cpu")
    launches = {
        ("softmax", 16384): (lambda: _softmax_launch(xs, ys, None, rows=True),
                             lambda: _softmax_launch(xs, ys, bs, rows=True),
                             lambda: _softmax_launch(xs, ys, None, rows=True, defer=True)),
        ("layernorm", 4096): (lambda: _layernorm_launch(xl, w, b, yl, None, EPS),
                              lambda: _layernorm_launch(xl, w, b, yl, bl, EPS),
                              lambda: _layernorm_launch(xl, w, b, yl, None, EPS, defer=True)),
    }
    kinds = ("no sketch", "finisher in the launch", "deferred")
    res = _interleaved_us({(op, k): fn for op, fns in launches.items() for k, fn in zip(kinds, fns)})
    deferred.settle_all()
    lines = [f"Row launches that defer, bf16 {SHAPE[0]} rows, host µs per call:", "",
             "| launch | " + " | ".join(kinds) + " |", "|---|" + "---:|" * len(kinds)]
    for op, n in launches:
        lines.append(f"| {op} x{n} | " + " | ".join(f"{statistics.median(res[((op, n), k)]):.1f}" for k in kinds) + " |")
    return lines


if __name__ == "__main__":
    write_report(host_only() if "--host" in sys.argv else main(), "launch_cost.md")
