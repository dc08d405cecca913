"""Is a kernel's cost after an L2 flush its data or its code? Each kernel is timed three ways in
interleaved rounds: L2 flushed (do_bench's 256 MB zero_, the host kept ahead: _bench_common.events_ms),
L2 flushed and then the same kernel launched once on a 16-row input before the timed launch (its code is
back in the L2 and the SMs' instruction caches; its data is not), and CUDA graph replays. A sketched
kernel holds about twice the SASS of the plain one (bench/offline_compile.py), so a flushed-only cost
that the warm-up launch takes away is instruction fetch, not the sketch's arithmetic.

    python bench/cold_code.py               # on a CUDA machine; writes $OUT/cold_code.md
    BENCH_OPS=rope,softmax BENCH_SHAPE=4096x16384 python bench/cold_code.py
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/

import torch
from _bench_common import events_ms, graph_ms, write_report
from gpu_kernels import OPS

from optwin.kernels.sketch_buffer import new_buffer

SHAPE = tuple(int(v) for v in os.environ.get("BENCH_SHAPE", "4096x16384").split("x"))
SMALL = (16, SHAPE[1])  # rows divisible by 16, as the large shape's: the same compiled kernel
OP_NAMES = os.environ.get("BENCH_OPS", "rmsnorm,layernorm,softmax,rope").split(",")
ROUNDS, REPS = 5, 30


def main() -> str:
    g = torch.Generator().manual_seed(0)
    entries = {}
    for name in OP_NAMES:
        b = OPS[name]
        big, params = b.make(SHAPE, torch.bfloat16, "cuda", g)
        small, sparams = b.make(SMALL, torch.bfloat16, "cuda", g)
        y, ys = torch.empty_like(big["x"]), torch.empty_like(small["x"])
        buf, sbuf = new_buffer(b.op, "cuda"), new_buffer(b.op, "cuda")
        for sk in (False, True):
            run = (lambda b=b, i=big, p=params, y=y, bb=buf if sk else None: b.launch(i, p, y, bb))
            warm = (lambda b=b, i=small, p=sparams, y=ys, bb=sbuf if sk else None: b.launch(i, p, y, bb))
            entries[(name, sk)] = (run, warm)
    for run, warm in entries.values():
        run()
        warm()
    methods = {"flushed": lambda r, w: events_ms(r, flush=True, sleep=True, reps=REPS),
               "flushed, code warm": lambda r, w: events_ms(r, flush=True, sleep=True, reps=REPS, warm=w),
               "graph": lambda r, w: graph_ms(r)}
    res: dict[tuple, list[float]] = {}
    for _ in range(ROUNDS):
        for key, (run, warm) in entries.items():
            for m, timer in methods.items():
                res.setdefault((*key, m), []).append(1e3 * timer(run, warm))
    lines = [f"# Flushed cost: data or code; bf16 {SHAPE[0]}x{SHAPE[1]}, {torch.cuda.get_device_name()}, "
             f"{ROUNDS} interleaved rounds", "", "µs median over rounds without / with the sketch (sketch cost)", "",
             "| op | " + " | ".join(methods) + " |", "|---|" + "---:|" * len(methods)]
    for name in OP_NAMES:
        cells = []
        for m in methods:
            a, s = (statistics.median(res[(name, sk, m)]) for sk in (False, True))
            cells.append(f"{a:.1f} / {s:.1f} ({100 * (s / a - 1):+.1f} %)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\ntorch {torch.__version__}\n"


if __name__ == "__main__":
    write_report(main(), "cold_code.md")
