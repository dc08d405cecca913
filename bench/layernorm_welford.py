"""layernorm's two kernels side by side at several widths: the Welford kernel (a program per row, as
torch.compile runs layernorm) and the row held in registers (two trees), with and without the sketch,
against torch.compile; to decide which rows the Welford launch takes (twin.numerics.welford_chunk).

    BENCH_ROUNDS=5 python bench/layernorm_welford.py      # on a CUDA machine; writes $OUT/layernorm_welford.md
    BENCH_SHAPES=4096x16384,8192x8192 python bench/layernorm_welford.py
    TRITON_INTERPRET=1 python bench/layernorm_welford.py --smoke   # CPU dry run, small shapes

Timed in interleaved rounds (every entry once per round), L2 flushed (do_bench) and from CUDA graphs;
y checked against float64, and each kernel's y with the sketch against its y without.
The first runs (bench/results/layernorm_welford_h200_s20.md) timed a prototype Welford kernel at 4096x16384:
4096-wide pieces at 16 warps with the row length compiled in 70.8 / 67.9 µs (torch.compile 72.8 /
69.5); the row length at run time 115.3; 2048-wide pieces 81.9, 8192-wide 79.9; 8 or 32 warps 78.7 / 83.9.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/, for the modules below

import torch
from _bench_common import entry_ms, write_report

from optwin.kernels.layernorm import EPS, _layernorm_launch
from optwin.kernels.sketch_buffer import new_buffer

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
SHAPES = [(3, 4096)] if SMOKE else [tuple(int(v) for v in s.split("x")) for s in os.environ.get(
    "BENCH_SHAPES", "4096x16384,8192x8192,16384x4096,4096x12000").split(",")]
ROUNDS = 1 if SMOKE else int(os.environ.get("BENCH_ROUNDS", "5"))
# more Welford launches to time, (chunk, warps) pairs: BENCH_WELFORD=2048x8,2048x16 (not the twin's numerics
# unless the chunk is twin.numerics.welford_chunk's)
EXTRA = [tuple(int(v) for v in s.split("x")) for s in os.environ.get("BENCH_WELFORD", "").split(",") if s]


def _section(rows: int, n: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(rows, n, generator=g) * 2 + 0.5).to(torch.bfloat16).to(DEV)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16).to(DEV)
    b = (0.1 * torch.randn(n, generator=g)).to(torch.bfloat16).to(DEV)
    ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), EPS)
    buf = new_buffer("layernorm", x.device)
    entries: dict[str, Callable[[], Any]] = {}
    checks = []
    for kernel, welford in (("welford", True), ("registers", False)):
        y, y0 = torch.empty_like(x), torch.empty_like(x)
        entries[kernel] = lambda y0=y0, wf=welford: _layernorm_launch(x, w, b, y0, None, EPS, welford=wf)
        entries[f"{kernel} + sketch"] = lambda y=y, wf=welford: _layernorm_launch(x, w, b, y, buf, EPS, welford=wf)
        entries[kernel]()
        entries[f"{kernel} + sketch"]()
        err = float((y0.double() - ref).norm() / ref.norm())
        checks.append(f"| {kernel} | {err:.3e} | {'yes' if torch.equal(y.view(torch.int16), y0.view(torch.int16)) else 'NO'} |")
    for chunk, warps in EXTRA:
        if n >= chunk:
            entries[f"welford chunk={chunk} warps={warps}"] = lambda c=chunk, wp=warps: _layernorm_launch(
                x, w, b, torch.empty_like(x), None, EPS, welford=True, welford_chunk=c, num_warps=wp)
    if not SMOKE:
        entries["torch.compile"] = torch.compile(lambda: torch.nn.functional.layer_norm(x, (n,), w, b, EPS), dynamic=False)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(ROUNDS):
        for method in ("flush", "graph"):
            for name, fn in entries.items():
                times.setdefault((name, method), []).append(entry_ms(fn, "graph" if method == "graph" else "do_bench", SMOKE))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = {m: med.get(("torch.compile", m), med[("registers", m)]) for m in ("flush", "graph")}
    out = [f"## bf16 {rows}x{n}", "", "| launch | µs flushed (min-max) | vs compile | sketch cost | µs graph | vs compile | sketch cost |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for name in entries:
        plain = name.removesuffix(" + sketch")
        cells = []
        for m in ("flush", "graph"):
            t = med[(name, m)]
            rng = f" ({1e3 * min(times[(name, m)]):.1f}-{1e3 * max(times[(name, m)]):.1f})" if m == "flush" else ""
            cost = f"{100 * (t / med[(plain, m)] - 1):+.1f}%" if plain != name else ""
            cells += [f"{1e3 * t:.1f}{rng}", f"{base[m] / t:.3f}x", cost]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", "| kernel | y rel. err vs float64 | y same with the sketch |", "|---|---:|---|", *checks, ""]
    return out


def main() -> str:
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() and not SMOKE else "CPU (smoke)"
    lines = [f"# layernorm: the Welford kernel against the row in registers, {dev}, {ROUNDS} interleaved rounds", ""]
    for rows, n in SHAPES:
        lines += _section(rows, n)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    write_report(main(), "layernorm_welford.md")
