"""softmax's deferred finishing (optwin.kernels.deferred) against the row launch with its finisher program and
the launch without the sketch, timed side by side in interleaved rounds, with a GPU check of its features.

    python bench/deferred_finish.py                                   # writes $OUT/deferred_finish.md
    BENCH_SHAPES=4096x16384,8192x8192 BENCH_ROUNDS=7 BENCH_PAGE_CALLS=16 python bench/deferred_finish.py
    python bench/deferred_finish.py --profile                        # cProfile of the deferred host path
    python bench/deferred_finish.py --settle                         # a settle's GPU time by rows a call
    python bench/deferred_finish.py --trace                          # torch.profiler of calls back to back
    TRITON_INTERPRET=1 python bench/deferred_finish.py --smoke        # CPU dry run, small shapes, no timing

Timing, per shape and input (bench/gpu_kernels.py's softmax inputs: random with a masked column, and HF's
finfo.min mask), µs per call, median over interleaved rounds:
- flushed: triton.testing.do_bench(return_mode="mean"), L2 flushed before each call. The deferred entry's
  mean takes in the finisher launches of the pages its calls filled (one per deferred.PAGE_CALLS calls): the
  finisher's cost, amortized, is in the number (a median would leave those calls out).
- back to back: 64 calls between two events, no flush (how a model's layers run them), settles included.
- GPU ahead: the same 64 calls queued behind a ~10 ms GPU sleep, so the host's launch time cannot show (the GPU's
  own time back to back; the difference from the entry before is what the host cost).
- host: µs of the host's launch path per call (2000 launches of 64 rows of the shape's width, the GPU idle
  behind them), the deferred entry's page bookkeeping and settles included.
Check (every shape): per input, and on rows with NaN / inf, the deferred features are the in-launch
finisher's bit for bit and y is the same; after settle_all every page's records and workspace are back at
rest (deferred.leftover()).
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))

import torch
from _bench_common import (
    AHEAD_CYCLES,
    TRACE_HEADER,
    deferred_verdict,
    differing_features,
    env_shapes,
    events_ms,
    traced_windows,
    watchdog,
    write_report,
)
from gpu_kernels import OPS

from optwin.kernels import deferred, read_sketch
from optwin.kernels.sketch_buffer import new_buffer
from optwin.kernels.softmax import _softmax_launch

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
SHAPES = env_shapes("48x64" if SMOKE else "4096x16384,8192x8192")
DTYPE = getattr(torch, os.environ.get("BENCH_DTYPE", "bfloat16"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))
INPUTS = ("softmax", "softmax (hf mask)")
BACK_TO_BACK = 64
deferred.PAGE_CALLS = int(os.environ.get("BENCH_PAGE_CALLS", deferred.PAGE_CALLS))  # calls a page settles after
deferred.DESC_RING = int(os.environ.get("BENCH_DESC_RING", deferred.DESC_RING))  # settles before a wait


def _entries(x: torch.Tensor, y: torch.Tensor) -> dict[str, object]:
    """The launches over x, each a no-argument callable (rows=True: the row launch at any width)."""
    buf = new_buffer("softmax", x.device)
    rows = True if SMOKE else None  # on the GPU the shapes' own default: the row launch at ROWS_BLOCKS
    return {
        "no sketch": lambda: _softmax_launch(x, y, None, rows=rows),
        "finisher in the launch": lambda: _softmax_launch(x, y, buf, rows=rows),
        "deferred": lambda: _softmax_launch(x, y, None, rows=rows, defer=True),
        "deferred, fresh blocks": _fresh_blocks(lambda: _softmax_launch(x, y, None, rows=rows, defer=True)),
    }


def _fresh_blocks(fn):
    """fn with deferred.RETIRED_BLOCKS at 0 while it runs: a settle inside it keeps no block, so every batch
    unbinds a fresh one (the form before the blocks were reused: the A/B in one run)."""
    def call():
        keep = deferred.RETIRED_BLOCKS
        deferred.RETIRED_BLOCKS = 0
        try:
            return fn()
        finally:
            deferred.RETIRED_BLOCKS = keep
    return call


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return not differing_features(a, b)


def _check(x: torch.Tensor) -> str:
    """'ok' where the deferred launch's y and features are the in-launch finisher's, bit for bit."""
    rows = True if SMOKE else None
    y0, y1 = torch.empty_like(x), torch.empty_like(x)
    b0 = new_buffer("softmax", x.device)
    _softmax_launch(x, y0, b0, rows=rows)
    b1 = _softmax_launch(x, y1, None, rows=rows, defer=True)
    return deferred_verdict("softmax", x.shape, y0, b0, y1, b1, "not deferred (no row launch at this width)")


def _inputs(g: torch.Generator, count: int, n: int) -> list[torch.Tensor]:
    """count bf16 inputs of 100-700 rows of n (smoke: 6-22), every third with NaN / inf rows, every fifth
    HF-masked."""
    xs = []
    for k in range(count):
        x = torch.randn(6 + k % 17 if SMOKE else 100 + 37 * (k % 17), n, generator=g) * (1 + k % 4)
        if k % 3 == 0:
            x[k % 5, 3], x[-1, 0] = math.nan, math.inf
        if k % 5 == 0:
            x[:, n // 2:] = torch.finfo(torch.bfloat16).min
        xs.append(x.to(torch.bfloat16).to(DEV))
    return xs


def _agree(pairs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> str:
    """'ok' where every (x, in-launch buffer, deferred buffer) reads the same features, bit for bit."""
    bad = [k for k, (x, b0, b1) in enumerate(pairs)
           if not _same(read_sketch("softmax", b0, x.shape), read_sketch("softmax", b1, x.shape))]
    return "ok" if not bad else f"calls {bad[:8]} differ"


def _many_calls(g: torch.Generator) -> list[str]:
    """PAGE_CALLS * 2 + 5 deferred calls of mixed rows, every buffer read only at the end (pages settled when
    full, the last by the reads): the features of each, against its in-launch twin."""
    n = 64 if SMOKE else SHAPES[0][1]
    rows = True if SMOKE else None
    pairs = []
    for x in _inputs(g, 2 * deferred.PAGE_CALLS + 5 if not SMOKE else 5, n):
        b0 = new_buffer("softmax", x.device)
        _softmax_launch(x, torch.empty_like(x), b0, rows=rows)
        pairs.append((x, b0, _softmax_launch(x, torch.empty_like(x), None, rows=rows, defer=True)))
    return [f"| mixed rows x{n} | {len(pairs)} calls, read after their pages settled | {_agree(pairs)} |"]


def _streams_and_graphs(g: torch.Generator) -> list[str]:
    """Calls on two side streams at once (a page each), settled from the default stream; and a launch
    with defer inside CUDA graph capture, which finishes in its own launch (nothing would settle a replay)."""
    n = SHAPES[0][1]
    xs = _inputs(g, 12, n)
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    pairs = []
    for k, x in enumerate(xs):
        b0 = new_buffer("softmax", x.device)
        _softmax_launch(x, torch.empty_like(x), b0)
        s = streams[k % 2]
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y = torch.empty_like(x)
            pairs.append((x, b0, _softmax_launch(x, y, None, defer=True)))
    deferred.settle_all()
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    out = [f"| 12 calls x{n} | two side streams, settled from the default one | {_agree(pairs)} |"]
    x = xs[1]
    y = torch.empty_like(x)
    b0 = new_buffer("softmax", x.device)
    _softmax_launch(x, y, b0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm the capture's launch outside it
            buf = _softmax_launch(x, y, None, defer=True)
    torch.cuda.current_stream().wait_stream(side)
    deferred.settle_all()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        buf = _softmax_launch(x, y, None, defer=True)
    captured_pending = deferred.pending(buf)
    graph.replay()
    ok = not captured_pending and _same(read_sketch("softmax", b0, x.shape), read_sketch("softmax", buf, x.shape))
    out.append(f"| {x.shape[0]}x{n} | defer inside CUDA graph capture: not deferred, the replay's features | "
               f"{'ok' if ok else 'differ' + (' (deferred in capture)' if captured_pending else '')} |")
    return out


def _host_us(fn, calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t) * 1e6 / calls
    torch.cuda.synchronize()
    return us


def main() -> None:
    from triton.testing import do_bench

    g = torch.Generator().manual_seed(5)
    name = torch.cuda.get_device_name() if not SMOKE else "CPU (TRITON_INTERPRET smoke run)"
    lines = [f"# softmax: deferred finishing against the finisher in the launch; {name}, {DTYPE}", "",
             f"Command: `BENCH_SHAPES={','.join(f'{r}x{c}' for r, c in SHAPES)} BENCH_ROUNDS={ROUNDS} "
             f"BENCH_PAGE_CALLS={deferred.PAGE_CALLS} BENCH_DESC_RING={deferred.DESC_RING} python bench/deferred_finish.py`", "",
             f"deferred.PAGE_CALLS = {deferred.PAGE_CALLS}; µs per call, median over {ROUNDS} interleaved rounds "
             "(min-max); cost: against the launch without the sketch", ""]
    checks = []
    table = ["| shape | input | launch | flushed µs | cost | back to back µs | cost | GPU ahead µs | cost | host µs |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for shape in SHAPES:
        for op in INPUTS:
            inp, _ = OPS[op].make(shape, DTYPE, DEV, g)
            x = inp["x"].reshape(-1, shape[-1])
            checks.append(f"| {shape[0]}x{shape[1]} | {op} | {_check(x)} |")
            if SMOKE:
                continue
            y = torch.empty_like(x)
            entries = _entries(x, y)
            flushed: dict[str, list[float]] = {k: [] for k in entries}
            b2b: dict[str, list[float]] = {k: [] for k in entries}
            ahead: dict[str, list[float]] = {k: [] for k in entries}
            for _ in range(ROUNDS):
                for k, fn in entries.items():
                    flushed[k].append(do_bench(fn, return_mode="mean") * 1e3)
                    b2b[k].append(events_ms(fn, flush=False, sleep=False, calls=BACK_TO_BACK, reps=1) * 1e3)
                    ahead[k].append(events_ms(fn, flush=False, sleep=AHEAD_CYCLES, calls=BACK_TO_BACK, reps=1) * 1e3)
            small = x[:64].clone()
            ys = torch.empty_like(small)
            host = {k: _host_us(fn) for k, fn in _entries(small, ys).items()}
            deferred.settle_all()
            base_f = statistics.median(flushed["no sketch"])
            base_b = statistics.median(b2b["no sketch"])
            base_a = statistics.median(ahead["no sketch"])
            for k in entries:
                f, b, a = statistics.median(flushed[k]), statistics.median(b2b[k]), statistics.median(ahead[k])
                table.append(f"| {shape[0]}x{shape[1]} | {op} | {k} | {f:.1f} ({min(flushed[k]):.1f}-"
                             f"{max(flushed[k]):.1f}) | {100 * (f / base_f - 1):+.1f}% | {b:.1f} | "
                             f"{100 * (b / base_b - 1):+.1f}% | {a:.1f} | {100 * (a / base_a - 1):+.1f}% | "
                             f"{host[k]:.1f} |")
    # rows with NaN / inf: flagged rows go through each call's own workspace
    n_rows = 40 if SMOKE else 512
    x = torch.randn(n_rows, SHAPES[0][1], generator=g).to(DTYPE).to(DEV)
    x[3, 5], x[n_rows // 2, 7], x[n_rows - 1, 0] = math.nan, math.inf, -math.inf
    checks.append(f"| {n_rows}x{SHAPES[0][1]} | NaN / inf rows | {_check(x)} |")
    checks += _many_calls(g)
    if not SMOKE:
        checks += _streams_and_graphs(g)
    deferred.settle_all()
    left = deferred.leftover()
    checks.append(f"| all | records / workspace slots left off rest after settle_all | "
                  f"{'ok' if left == (0, 0) else left} |")
    if not SMOKE:
        lines += table + [""]
    lines += ["| shape | input | deferred = finisher in the launch (y and features, bit for bit) |", "|---|---|---|"]
    lines += checks
    lines += ["", f"torch {torch.__version__}"]
    write_report("\n".join(lines) + "\n", "deferred_finish.md")


def settle_times() -> None:
    """--settle: GPU time of one settle (the descriptor copy and the finisher launch over a full page) against
    the calls' rows, softmax bf16 rows of 8192 (the row launch), per row count (deferred.MAX_ROWS lifted);
    events around settle_all() after a page of calls ran, median of 5."""
    deferred.MAX_ROWS = 1 << 30
    lines = ["| rows a call | calls a page | settle µs | µs a call | the call's rows, µs (one launch) |",
             "|---:|---:|---:|---:|---:|"]
    for n_rows in (4096, 32768, 131072):
        x = torch.randn(n_rows, 8192, device=DEV).to(torch.bfloat16)
        y = torch.empty_like(x)
        deferred.settle_all()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        settles, rows_us = [], []
        for _ in range(5):
            bufs = [_softmax_launch(x, y, None, defer=True) for _ in range(2)]
            page = deferred._page_of(bufs[0])
            while deferred.pending(bufs[0]) and len(page.calls) < page.calls_cap:
                start.record()
                _softmax_launch(x, y, None, defer=True)
                end.record()
            end.synchronize()
            rows_us.append(start.elapsed_time(end) * 1e3)
            calls = len(page.calls)
            torch.cuda._sleep(4_000_000)  # ~2 ms of GPU work ahead: the settle is queued before start fires
            start.record()
            deferred.settle_all()
            end.record()
            end.synchronize()
            settles.append(start.elapsed_time(end) * 1e3)
        med = statistics.median(settles)
        lines.append(f"| {n_rows} | {calls} | {med:.1f} | {med / calls:.2f} | {statistics.median(rows_us):.1f} |")
    write_report("\n".join([f"# softmax: a deferred settle's GPU time; {torch.cuda.get_device_name()}", "",
                             "Command: `python bench/deferred_finish.py --settle`", ""] + lines) + "\n",
                 "deferred_settle.md")


def trace() -> None:
    """--trace: _bench_common.traced_windows over each sketched entry at each shape (random scores)."""
    lines = [TRACE_HEADER]
    g = torch.Generator().manual_seed(5)
    for shape in SHAPES:
        inp, _ = OPS["softmax"].make(shape, DTYPE, DEV, g)
        x = inp["x"].reshape(-1, shape[-1])
        for name, fn in _entries(x, torch.empty_like(x)).items():
            if name != "no sketch":
                lines.append(traced_windows(fn, f"{shape[0]}x{shape[1]}", name, BACK_TO_BACK))
    write_report("\n".join([f"# softmax: deferred finishing back to back, traced; {torch.cuda.get_device_name()}", "",
                             f"Command: `BENCH_SHAPES={','.join(f'{r}x{c}' for r, c in SHAPES)} python "
                             "bench/deferred_finish.py --trace`", ""] + lines) + "\n", "deferred_trace.md")


def profile() -> None:
    """--profile: cProfile of the host's deferred launch path (2000 launches of 64 rows): top 25 by own time, and
what the settles, reservations and finisher launches call."""
    import cProfile
    import io
    import pstats

    x = OPS["softmax"].make((64, SHAPES[0][1]), DTYPE, DEV, torch.Generator().manual_seed(5))[0]["x"]
    x = x.reshape(-1, SHAPES[0][1])
    y = torch.empty_like(x)
    fn = _entries(x, y)["deferred"]
    _host_us(fn, 200)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumtime").print_callees("_settle|reserve|finish_deferred")
    write_report(out.getvalue(), "deferred_profile.txt")


if __name__ == "__main__":
    if not SMOKE:
        watchdog()
    if "--profile" in sys.argv:
        profile()
    elif "--settle" in sys.argv:
        settle_times()
    elif "--trace" in sys.argv:
        trace()
    else:
        main()
