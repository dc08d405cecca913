"""One kernel timed four ways, side by side in interleaved rounds, to tell a kernel's own time from
what the timing method adds (L2 flush, host launch cost, back-to-back overlap).

    python bench/timing_modes.py      # on a CUDA machine; writes $OUT/timing_modes.md

Methods, each the median over its repetitions:
- flush: L2 flushed (a 256 MB zero_, as triton.testing.do_bench), then events around one launch;
- flush+sleep: the same with a GPU sleep queued first, so the host is ahead of the GPU and a slow
  host launch cannot show up as GPU time;
- eager x10: events around 10 launches back to back, no flush (host-launched);
- graph x10: a CUDA graph of 10 launches, replayed (no host cost, no flush; _bench_common.graph_ms).
Launches: rmsnorm bf16 (BENCH_SHAPES=rows x hidden, ...; default 4096x16384) as shipped with and
without the sketch, torch.compile of the production variant, the one-row kernel (row_grid=True: with
the sketch, row records at 1 and 2 loop stages) and the loop kernel (row_grid=False: without the
sketch a program per row through the persistent kernel's loop, stop 17's launch at 16384; with it
the persistent grid), and with BENCH_POLLS=256,1024 row records at other poll sizes. Each sketched
launch's features are checked against optwin.ingest's once (the last column).
Last runs: bench/results/timing_modes_h200_s18*.md.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/

import torch
from _bench_common import events_ms, graph_ms, write_report

from optwin.kernels import production as P
from optwin.kernels._common import occupancy_table
from optwin.kernels.rmsnorm import EPS, _rmsnorm_launch
from optwin.kernels.sketch_buffer import new_buffer

ROUNDS = 5


METHODS: dict[str, Callable[[Callable[[], Any]], float]] = {
    "flush": lambda fn: events_ms(fn, flush=True, sleep=False),
    "flush+sleep": lambda fn: events_ms(fn, flush=True, sleep=True),
    "eager x10": lambda fn: events_ms(fn, flush=False, sleep=True, calls=10),
    "graph x10": graph_ms,
}


SHAPES = [tuple(int(v) for v in sh.split("x")) for sh in os.environ.get("BENCH_SHAPES", "4096x16384").split(",")]
POLLS = [int(p) for p in os.environ.get("BENCH_POLLS", "").split(",") if p]  # more launches: words a finisher poll


def launches_for(rows: int, n: int) -> dict[str, Any]:
    """{"x", "w", "buf": the inputs and sketch buffer, "launches": name -> launch}."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(rows, n, device="cuda", generator=g) * 2).to(torch.bfloat16)
    w = (1 + 0.2 * torch.randn(n, device="cuda", generator=g)).to(torch.bfloat16)
    y, buf = torch.empty_like(x), new_buffer("rmsnorm", x.device)
    # a static kernel per shape: by default the second shape recompiled dynamic (121.6 µs at
    # 4096x16384 against 70.5, bench/results/timing_modes_h200_s18c.md)
    prod = torch.compile(P.rmsnorm_fp32_acc, dynamic=False)
    launches = {
        "no sketch": lambda: _rmsnorm_launch(x, w, y, None, EPS),
        "torch.compile": lambda: prod(x, w, EPS),
        "no sketch, one-row kernel": lambda: _rmsnorm_launch(x, w, y, None, EPS, row_grid=True),
        "no sketch, loop kernel": lambda: _rmsnorm_launch(x, w, y, None, EPS, row_grid=False),
        "sketch": lambda: _rmsnorm_launch(x, w, y, buf, EPS),
        "sketch, row records": lambda: _rmsnorm_launch(x, w, y, buf, EPS, row_grid=True),
        "sketch, row records, 2 stages": lambda: _rmsnorm_launch(x, w, y, buf, EPS, row_grid=True, stages=2),
        "sketch, persistent": lambda: _rmsnorm_launch(x, w, y, buf, EPS, row_grid=False),
        **{f"sketch, row records, {p} words a poll": (lambda p=p: _rmsnorm_launch(x, w, y, buf, EPS, row_grid=True, poll=p))
           for p in POLLS},
    }
    return {"x": x, "w": w, "buf": buf, "launches": launches}


def sketch_check(setup: dict[str, Any]) -> dict[str, str]:
    """Per sketched launch: its sketch against optwin.ingest's (largest relative difference), so a
    timed variant is also a checked one."""
    from optwin.ingest.sketch import sketch as ingest_sketch
    from optwin.kernels.sketch_buffer import read_sketch

    x, w, buf = setup["x"], setup["w"], setup["buf"]
    want = ingest_sketch("rmsnorm", {"x": x, "weight": w})
    out = {}
    for name, fn in setup["launches"].items():
        if not name.startswith("sketch"):
            continue
        buf.fill_(float("nan"))
        fn()
        got = read_sketch("rmsnorm", buf)
        out[name] = f"{max(abs(got[k] - v) / max(abs(v), 1e-30) for k, v in want.items()):.1e}"
    return out


def main() -> str:
    return "\n".join(section(rows, n) for rows, n in SHAPES)


def section(rows: int, n: int) -> str:
    setup = launches_for(rows, n)
    launches = setup["launches"]
    for fn in launches.values():
        fn()
    res: dict[tuple[str, str], list[float]] = {}
    for _ in range(ROUNDS):
        for m, timer in METHODS.items():
            for name, fn in launches.items():
                res.setdefault((name, m), []).append(1e3 * timer(fn))
    lines = [f"# Timing methods, rmsnorm bf16 {rows}x{n}; {torch.cuda.get_device_name()}, {ROUNDS} interleaved rounds",
             "", "µs, median over rounds (min-max); cost = against 'no sketch' by the same method", "",
             "| launch | " + " | ".join(METHODS) + " | sketch vs ingest |", "|---|" + "---:|" * len(METHODS) + "---|"]
    checked = sketch_check(setup)
    for name in launches:
        cells = []
        for m in METHODS:
            v = statistics.median(res[(name, m)])
            base = statistics.median(res[("no sketch", m)])
            cost = "" if name == "no sketch" else f" {100 * (v / base - 1):+.1f}%"
            cells.append(f"{v:.1f} ({min(res[(name, m)]):.1f}-{max(res[(name, m)]):.1f}){cost}")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {checked.get(name, '')} |")
    lines += ["", "programs per SM:", "", *(f"- {k}: {v}" for k, v in occupancy_table().items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    write_report(main(), "timing_modes.md")
