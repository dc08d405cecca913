"""Pieces the GPU kernel benches share (bench/gpu_kernels.py, bench/sketch_lanes.py,
bench/softmax_sketch.py): sweep configs under a time budget, the sketch-vs-ingest difference, the
report's closing lines and where the report goes. Not a script; the benches put bench/ on sys.path.

    from _bench_common import config_name, report_tail, worst_diff, write_report
"""

from __future__ import annotations

import faulthandler
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch


def watchdog(default_s: float = 420.0) -> None:
    """On a CUDA machine, end the process, every thread's traceback on stderr, once it has run
    BENCH_WATCHDOG_S seconds (default 420; 0: off). A kernel that never finishes then costs its device call
    that long and says where it hung, not the call's whole 600 s with an empty log (stop 36: a finisher's
    spin whose word never came). Scripts arm it in their __main__ only, and not on the CPU (their smoke
    runs in the tests take what the CI machine gives them)."""
    seconds = float(os.environ.get("BENCH_WATCHDOG_S", default_s))
    if seconds > 0 and torch.cuda.is_available():
        faulthandler.dump_traceback_later(seconds, exit=True)


def config_name(cfg: dict[str, Any]) -> str:
    """A sweep config's label in the tables: `k=v,k=v` (launch overrides), `default` for none."""
    return ",".join(f"{k}={v}" for k, v in cfg.items()) or "default"


def within_budget(cfgs: Iterable[dict[str, Any]], t0: float, budget_s: float, out: list[str], label: str,
                  cols: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, cfg) of each config while time.monotonic() - t0 <= budget_s; past it, a table row
    `| label | name | skipped: budget spent |` with `cols` empty cells goes to `out` instead."""
    for cfg in cfgs:
        name = config_name(cfg)
        if time.monotonic() - t0 > budget_s:
            out.append(f"| {label} | {name} | skipped: budget spent |" + " |" * cols)
            continue
        yield name, cfg


def worst_diff(got: dict[str, float], want: dict[str, float]) -> str:
    """Largest relative difference of a kernel's sketch features vs optwin.ingest's, as
    `1.2e-08 (feature)` (a NaN difference wins), or `0` when every feature is equal."""
    worst, key = 0.0, ""
    for k, w in want.items():
        d = abs(got[k] - w) / max(abs(w), 1e-30) if got[k] != w else 0.0
        if d > worst or math.isnan(d):
            worst, key = d, k
    return f"{worst:.1e} ({key})" if key else "0"


def differing_features(got: dict[str, float], want: dict[str, float]) -> list[str]:
    """The features of `want` whose value in `got` is not the same, bit for bit (NaN matches NaN)."""
    return [k for k, w in want.items() if not (got[k] == w or (math.isnan(got[k]) and math.isnan(w)))]


def deferred_verdict(op: str, shape: tuple[int, ...], y0: torch.Tensor, b0: torch.Tensor, y1: torch.Tensor,
                     b1: torch.Tensor, not_deferred: str = "not deferred") -> str:
    """'ok' where a deferred launch (y1, its pending buffer b1) wrote the in-launch finisher's y (y0) and features
    (b0) bit for bit; else what differs, or `not_deferred` where b1 was final at once."""
    from optwin.kernels import deferred, read_sketch

    if not deferred.pending(b1):
        return not_deferred
    want, got = read_sketch(op, b0, shape), read_sketch(op, b1, shape)
    if not torch.equal(y0.view(torch.int16), y1.view(torch.int16)):
        return "y differs"
    bad = differing_features(got, want)
    return "ok" if not bad else f"features differ: {', '.join(bad)}"


def report_tail(lines: list[str], t0: float, title: str, keep: Callable[[tuple], bool]) -> str:
    """The whole report: `lines`, then `title` over each compiled kernel's programs per SM (the
    occupancy keys `keep` accepts), torch's version and the wall time since t0."""
    from optwin.kernels._common import occupancy_table

    occ = [f"- {k}: {v}" for k, v in sorted(occupancy_table().items(), key=str) if keep(k)]
    tail = ["", title, "", *occ, f"\ntorch {torch.__version__}; wall {time.monotonic() - t0:.0f} s"]
    return "\n".join(lines + tail) + "\n"


def dtype_name(dt: torch.dtype) -> str:
    """'bfloat16' for torch.bfloat16: the catalog's name, as the reports print it."""
    return str(dt).removeprefix("torch.")


def write_report(md: str, name: str) -> None:
    """Print the report; with $OUT set, also write it to $OUT/<name>."""
    print(md)
    out = os.environ.get("OUT")
    if out:
        Path(out, name).write_text(md)


def graph_ms(fn: Callable[[], Any], calls: int = 10, replays: int = 20) -> float:
    """ms per call of fn replayed from a CUDA graph of `calls` calls: no host cost and no L2 flush
    between calls, as a serving loop's graphs run (do_bench flushes L2 before each call; the two
    methods ranked some launches differently on the H200: bench/results/timings_h200_s15.md)."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (replays * calls)


SLEEP_CYCLES = 400_000  # ~0.2 ms at the H200's clock: longer than any host launch here
# ~10 ms of GPU sleep: longer than the host takes to queue a window of 64 launches (the deferred finisher's page),
# so that window's GPU time, its settle included, shows without the host's (events_ms's sleep)
AHEAD_CYCLES = 20_000_000


def events_ms(fn: Callable[[], Any], flush: bool, sleep: bool | int, calls: int = 1, reps: int = 40,
              warm: Callable[[], Any] | None = None) -> float:
    """Median ms per call of `calls` launches between two events, over `reps` repetitions; flush: a 256 MB
    zero_ first (L2 flushed, as triton.testing.do_bench); sleep: a GPU sleep queued before it (True:
    SLEEP_CYCLES; an int: that many cycles, longer than the host takes to queue the `calls`), so the
    host is ahead of the GPU and a slow host launch cannot show up as GPU time; warm: run after the
    flush, untimed (bench/cold_code.py: the kernel's code back in the caches, its data not)."""
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda") if flush else None  # L2 is 60 MB
    times = []
    for _ in range(reps):
        if sleep:
            torch.cuda._sleep(SLEEP_CYCLES if sleep is True else sleep)
        if flush:
            cache.zero_()
        if warm is not None:
            warm()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times) / calls


def entry_ms(fn: Callable[[], Any], method: str = "do_bench", smoke: bool = False) -> float:
    """ms of one entry in one round of an interleaved bench: do_bench's median (L2 flushed before each
    call), with method "graph" the mean of CUDA graph replays (graph_ms), "flush_sleep" do_bench's flush
    with the host kept ahead (events_ms: the kernel's own time, no host launch cost), and in a CPU
    smoke run one wall-clock call."""
    if smoke:
        t = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t)
    if method == "graph":
        return graph_ms(fn)
    if method == "flush_sleep":
        return events_ms(fn, flush=True, sleep=True)
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


TRACE_HEADER = ("| shape | launch | window µs a call | GPU busy µs a call | GPU gaps > 5 µs: count, µs a call | "
                "host µs a call: median | host calls > 100 µs: count, µs in all |\n|---|---|---:|---:|---:|---:|---:|")


def traced_windows(fn: Callable[[], Any], shape: str, name: str, calls: int) -> str:
    """A TRACE_HEADER row: three windows of `calls` calls of fn back to back (no sleep, no flush) under
    torch.profiler with CUDA activity only (no per-op host records, which slowed the host several fold): per
    window the GPU's busy time and its idle gaps between kernels, and each call's host time (perf_counter), its
    median and the calls past 100 µs; the chrome trace goes to $OUT gzipped. Where deferred launches lose back
    to back but not with the GPU ahead, this says whether the GPU waited on the host (stop 39)."""
    import gzip
    import json

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from optwin.kernels import deferred

    for _ in range(2 * calls):
        fn()
    deferred.settle_all()
    torch.cuda.synchronize()
    host: list[float] = []
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            for _ in range(calls):
                t = time.perf_counter()
                fn()
                host.append((time.perf_counter() - t) * 1e6)
            torch.cuda.synchronize()
    tag = name.replace(" ", "_").replace(",", "").replace("=", "")
    path = f"/tmp/trace_{shape}_{tag}.json"
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    out = os.environ.get("OUT")
    if out:
        with gzip.open(Path(out, Path(path).name + ".gz"), "wt") as f:
            json.dump(events, f)
    gpu = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in ("kernel", "gpu_memcpy"))
    windows = [gpu[k * len(gpu) // 3:(k + 1) * len(gpu) // 3] for k in range(3)]  # ~a third each
    span = sum(w[-1][1] - w[0][0] for w in windows)
    busy = sum(b - a for a, b in gpu)
    gaps = [b2[0] - a2[1] for w in windows for a2, b2 in zip(w, w[1:]) if b2[0] - a2[1] > 5]
    n = 3 * calls
    slow = [h for h in host if h > 100]
    return (f"| {shape} | {name} | {span / n:.1f} | {busy / n:.1f} | {len(gaps)}, {sum(gaps) / n:.1f} | "
            f"{statistics.median(host):.1f} | {len(slow)}, {sum(slow):.0f} |")


def env_shapes(default: str) -> list[tuple[int, ...]]:
    """BENCH_SHAPES (comma-separated RxC, e.g. 4096x16384,8192x8192), else `default` in that form."""
    return [tuple(int(v) for v in s.split("x")) for s in os.environ.get("BENCH_SHAPES", default).split(",")]
