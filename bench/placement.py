"""Does a kernel's time depend on where its output lies? The same launch, with and without the sketch,
into several output buffers at different addresses, timed in interleaved rounds.

    BENCH_OPS=rope,rmsnorm BENCH_PLACES=6 python bench/placement.py   # on a CUDA machine; $OUT/placement.md
    TRITON_INTERPRET=1 python bench/placement.py --smoke                # CPU dry run, small shapes

Why: rope's sketched launch read 81, 90 and 127 µs in one session for the same code (stop 13), while
each entry's rounds agreed within 1-2 %; every entry of those benches writes its own, fresh y.
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
from _bench_common import write_report
from gpu_kernels import OPS, _sweep_launcher
from norm_chunks import _bench

from optwin.kernels.sketch_buffer import new_buffer

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
SHAPES = {"rope": (4096, 128, 128)} if not SMOKE else {"rope": (8, 4, 32)}
SHAPE = (64, 700) if SMOKE else (4096, 16384)
PLACES = 2 if SMOKE else int(os.environ.get("BENCH_PLACES", "6"))
ROUNDS = 1 if SMOKE else int(os.environ.get("BENCH_ROUNDS", "5"))


def main() -> str:
    t0 = time.monotonic()
    ops = os.environ.get("BENCH_OPS", "rope,rmsnorm").split(",")
    name = torch.cuda.get_device_name() if DEV == "cuda" else "CPU (TRITON_INTERPRET smoke run)"
    lines = [f"# Output placement, {name}, bf16, {PLACES} output buffers per op, {ROUNDS} interleaved rounds", "",
             "| op | buffer | y address mod 2 MiB | µs median | min | max | + sketch µs | min | max |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    g = torch.Generator().manual_seed(2)
    entries = []
    keep = []  # spacers stay allocated so every y gets a new address
    for op in ops:
        inp, params = OPS[op].make(SHAPES.get(op, SHAPE), torch.bfloat16, DEV, g)
        x2 = {k: (v.reshape(-1, v.shape[-1]) if k == "x" and op != "rope" else v) for k, v in inp.items()}
        buf = new_buffer(op, DEV)
        for i in range(PLACES):
            keep.append(torch.empty(1 + 4099 * 512 * i, dtype=torch.uint8, device=DEV))  # a spacer of i x ~2 MiB
            y = torch.empty_like(x2["x"])
            f = _sweep_launcher(op, x2, params, y, {})
            f(buf)
            f(None)
            addr = y.data_ptr() % (2 << 20)
            entries.append((op, i, addr, lambda f=f: f(None), lambda f=f, buf=buf: f(buf)))
    times: dict[tuple[str, int, bool], list[float]] = {}
    for _ in range(ROUNDS):
        for op, i, _, plain, sketched in entries:
            times.setdefault((op, i, False), []).append(_bench(plain))
            times.setdefault((op, i, True), []).append(_bench(sketched))
    for op, i, addr, _, _ in entries:
        a, b = times[(op, i, False)], times[(op, i, True)]
        lines.append(f"| {op} | {i} | {addr} | {statistics.median(a) * 1e3:.1f} | {min(a) * 1e3:.1f} | {max(a) * 1e3:.1f} | "
                     f"{statistics.median(b) * 1e3:.1f} | {min(b) * 1e3:.1f} | {max(b) * 1e3:.1f} |")
    lines.append(f"\ntorch {torch.__version__}; wall {time.monotonic() - t0:.0f} s")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    write_report(main(), "placement.md")
