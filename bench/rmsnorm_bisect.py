"""Why is torch.compile's rmsnorm ~3 µs faster than ours at the same grid and warps (issue #6)?
Inductor's kernel for rmsnorm (fp32-acc) at 4096x16384 bf16 (bench/results/compile_codegen_h200_s12.md;
its autotuner picks R0_BLOCK=16384, XBLOCK=1, 32 warps: bench/results/compile_configs_h200_s14.md) is
copied here as one kernel with constexpr switches, each flipping one of its habits to ours, and every
variant is timed in interleaved rounds beside torch.compile and our shipped launch: with do_bench (L2
flushed before each call, host launch cost hidden only while the GPU is busier than the host), replayed
from a CUDA graph (no host cost), and the host's time per call.

    python bench/rmsnorm_bisect.py                  # on a CUDA machine; writes $OUT/rmsnorm_bisect.md
    TRITON_INTERPRET=1 python bench/rmsnorm_bisect.py --smoke   # CPU dry run, small shapes

Inductor's habits (switch off = Inductor's): the row is loaded twice (first load evict_last for the
sum, second evict_first for the output) instead of held in registers (KEEP_H); the row length is a
compile-time constant, so no mask (MASK: a runtime `cols < n` mask); no eviction hint on the store
(STORE_EVICT: evict_first); `/` by the constant n (DIV_RN: IEEE divide); FMA contraction on (FUSION off);
one row per program (PERSISTENT: our grid of resident programs walking rows).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/

import torch
import triton
import triton.language as tl
from _bench_common import write_report
from gpu_kernels import OPS, _sweep_launcher
from norm_chunks import _bench

from optwin.kernels.sketch_buffer import new_buffer, read_sketch

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
SHAPE = (16, 256) if SMOKE else (4096, 16384)
ROUNDS = 1 if SMOKE else int(os.environ.get("BENCH_ROUNDS", "7"))


@triton.jit
def _rms_bisect(x_ptr, w_ptr, y_ptr, n_rows, n_runtime, eps,
                N: tl.constexpr, KEEP_H: tl.constexpr, MASK: tl.constexpr, STORE_EVICT: tl.constexpr,
                DIV_RN: tl.constexpr, PERSISTENT: tl.constexpr, FIRST_EVICT: tl.constexpr):
    cols = tl.arange(0, N)
    if MASK:
        m = cols < n_runtime
    else:
        m = cols < N  # constant-folds to all true, as Inductor's r0_mask
    start = tl.program_id(0)
    step = tl.num_programs(0) if PERSISTENT else n_rows
    for r in tl.range(start, n_rows, step):
        row = tl.cast(r, tl.int64) * N
        x = tl.load(x_ptr + row + cols, mask=m, other=0.0, eviction_policy=FIRST_EVICT).to(tl.float32)
        ss = tl.sum(x * x, axis=0)
        if DIV_RN:
            v = tl.math.div_rn(ss, tl.cast(N, tl.float32))
        else:
            v = ss / N
        rs = tl.math.rsqrt(v + eps)
        w = tl.load(w_ptr + cols, mask=m, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if KEEP_H:
            h = x
        else:
            h = tl.load(x_ptr + row + cols, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
        y = (h * rs) * w
        if STORE_EVICT:
            tl.store(y_ptr + row + cols, y.to(y_ptr.dtype.element_ty), mask=m, eviction_policy="evict_first")
        else:
            tl.store(y_ptr + row + cols, y.to(y_ptr.dtype.element_ty), mask=m)


INDUCTOR = {"KEEP_H": False, "MASK": False, "STORE_EVICT": False, "DIV_RN": False, "PERSISTENT": False,
            "FIRST_EVICT": "evict_last", "FUSION": True, "warps": 32}
OURS_FLIPS = [{}, {"KEEP_H": True}, {"MASK": True}, {"STORE_EVICT": True}, {"DIV_RN": True}, {"FUSION": False},
              {"FIRST_EVICT": "evict_first", "KEEP_H": True},
              {"KEEP_H": True, "MASK": True, "STORE_EVICT": True, "DIV_RN": True, "FUSION": False,
               "FIRST_EVICT": "evict_first"},
              {"warps": 16}, {"warps": 8, "PERSISTENT": True}]


def _launcher(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, flips: dict):
    cfg = {**INDUCTOR, **flips}
    warps = 4 if SMOKE else cfg.pop("warps")
    cfg.pop("warps", None)
    fusion = cfg.pop("FUSION")
    n_rows, n = x.shape
    grid = 2 * 132 if cfg["PERSISTENT"] and not SMOKE else n_rows

    def run():
        _rms_bisect[(grid,)](x, w, y, n_rows, n, 1e-6, N=n, num_warps=warps, enable_fp_fusion=fusion, **cfg)

    return run


def _host_us(run, calls: int = 100) -> float:
    """Host time per call to enqueue `run` (no sync inside: the GPU queue does not fill in 100 calls)."""
    run()
    if DEV == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        run()
    dt = time.perf_counter() - t
    if DEV == "cuda":
        torch.cuda.synchronize()
    return 1e6 * dt / calls


def _graph_us(run) -> float:
    """Device time of `run` replayed from a CUDA graph (no host launch cost at all; no L2 flush)."""
    if SMOKE:
        return float("nan")
    import triton.testing

    return 1e3 * float(triton.testing.do_bench_cudagraph(run, rep=40, return_mode="median"))


def main() -> str:
    g = torch.Generator().manual_seed(2)
    inp, params = OPS["rmsnorm"].make(SHAPE, torch.bfloat16, DEV, g)
    x, w = inp["x"], inp["weight"]
    ref = OPS["rmsnorm"].eager(inp, params)
    entries = []
    if not SMOKE:
        fn = torch.compile(OPS["rmsnorm"].eager, dynamic=False)
        fn(inp, params)
        entries.append(("torch.compile (fp32-acc)", lambda: fn(inp, params), None))
    y_ours = torch.empty_like(x)
    f = _sweep_launcher("rmsnorm", inp, params, y_ours, {})
    entries.append(("ours, shipped launch (no sketch)", lambda: f(None), y_ours))
    buf = new_buffer("rmsnorm", DEV)
    entries.append(("ours, shipped launch + sketch", lambda: f(buf), y_ours))
    for flips in OURS_FLIPS:
        y = torch.empty_like(x)
        name = "inductor clone" + ("" if not flips else " + " + ",".join(f"{k}={v}" for k, v in flips.items()))
        entries.append((name, _launcher(x, w, y, flips), y))
    for _, run, _ in entries:
        run()
    times: dict[str, list[float]] = {name: [] for name, _, _ in entries}
    graph: dict[str, list[float]] = {name: [] for name, _, _ in entries}
    host = {name: _host_us(run) for name, run, _ in entries}
    for _ in range(ROUNDS):
        for name, run, _ in entries:
            times[name].append(1e3 * _bench(run))
            graph[name].append(_graph_us(run))
    name = torch.cuda.get_device_name() if DEV == "cuda" else "CPU (TRITON_INTERPRET smoke run)"
    base = statistics.median(times[entries[0][0]])
    title = (f"# rmsnorm: Inductor's kernel, one habit at a time; {name}, bf16 {SHAPE[0]}x{SHAPE[1]}, "
             f"{ROUNDS} interleaved rounds")
    lines = [title, "",
             "| kernel | µs median | min | max | vs first row | CUDA graph µs | host µs per call | max |y - eager| |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name_, _, y in entries:
        ts = times[name_]
        med = statistics.median(ts)
        err = "-" if y is None else f"{float((y.float() - ref.float()).abs().max()):.3g}"
        lines.append(f"| {name_} | {med:.1f} | {min(ts):.1f} | {max(ts):.1f} | {base / med:.3f}x | "
                     f"{statistics.median(graph[name_]):.1f} | {host[name_]:.0f} | {err} |")
    if not SMOKE:  # the sketch of a launch replayed from a CUDA graph is the eager launch's
        f(buf)
        eager = read_sketch("rmsnorm", buf)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            f(buf)
        buf.fill_(float("nan"))
        g.replay()
        g.replay()
        same = read_sketch("rmsnorm", buf) == eager
        lines += ["", f"sketch of the shipped launch replayed from a CUDA graph (twice) = eager sketch: {same}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    write_report(main(), "rmsnorm_bisect.md")
