"""rmsnorm / layernorm / rope sketch layouts timed against each other on one GPU (issue #6: the fused
sketch's cost; the per-lane accumulators against the per-row trees / per-element accumulators).

    BENCH_BUDGET_S=100 python bench/sketch_lanes.py   # on a CUDA machine; writes $OUT/sketch_lanes.md
    BENCH_OPS=rope python bench/sketch_lanes.py        # one op only
    TRITON_INTERPRET=1 python bench/sketch_lanes.py --smoke   # CPU dry run of the script, small shapes

Last runs: bench/results/sketch_lanes_h200_s11.md, bench/results/sketch_lanes_h200_s11b.md.

For each launch config at bench/gpu_kernels.py's timing shapes (bf16): the kernel without and with
the sketch (triton.testing.do_bench, median, L2 flushed), whether y is bit-identical between the two,
and the largest relative difference of the sketch vs optwin.ingest.sketch on the timing input and on
an input whose programs mix finite rows with NaN/±inf rows (the exact path after the loop).
Needs torch and triton only (the optwin modules it imports are pure Python + torch).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/, for the modules below

import torch
from _bench_common import report_tail, within_budget, worst_diff, write_report
from gpu_kernels import OPS, TIME_SHAPE, _sweep_launchers

from optwin.kernels.sketch_buffer import new_buffer, read_sketch

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
SHAPE = (800, 256) if SMOKE else TIME_SHAPE

# launch overrides per op; the first of each is the layout before the lane accumulators
CONFIGS: dict[str, list[dict[str, Any]]] = {
    "rope": [{"lane_acc": False}, {"lane_acc": True, "num_warps": 8, "keep": 8}, {"lane_acc": True, "num_warps": 8, "keep": 4},
             {"lane_acc": True, "num_warps": 8, "keep": 2}, {"lane_acc": True, "num_warps": 8, "keep": 8, "maxnreg": 0},
             {"lane_acc": True, "keep": 8}, {"lane_acc": True, "keep": 1}, {"lane_acc": True, "num_warps": 8, "keep": 1}],
    # layernorm keeps one layout (lane max + row slots) since stop 12: KEEP is its only option
    "layernorm": [{"keep": 1}, {"keep": 8}],
    "rmsnorm": [{}],  # its lane max was measured and dropped (rmsnorm.py): the shipped launch only
}


def _special(op: str, inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The op's input with NaN/±inf in a few rows and a large finite value in a finite row."""
    x = inp["x"].clone()
    flat = x.view(-1, x.shape[-1])
    flat[1, 17] = float("nan")
    flat[2, 3] = float("inf")
    flat[700, 5] = -float("inf")
    flat[265, 40] = 1000.0  # a finite row of a program that also has a NaN row (264 programs: 2 per SM)
    return dict(inp, x=x)


def _diff(op: str, inp: dict[str, torch.Tensor], params: dict[str, Any], buf: torch.Tensor) -> str:
    from optwin.ingest.sketch import sketch as ingest_sketch

    return worst_diff(read_sketch(op, buf, inp["x"].shape, params), ingest_sketch(op, inp, params))


def _bench(fn) -> float:
    """Median ms: triton.testing.do_bench on CUDA; one timed call in the smoke run."""
    if SMOKE:
        t = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t)
    import triton.testing

    return float(triton.testing.do_bench(fn, return_mode="median"))


def main() -> str:
    t0, budget = time.monotonic(), float(os.environ.get("BENCH_BUDGET_S", "100"))
    x0 = torch.randn(*SHAPE, device=DEV).to(torch.bfloat16)
    yc = torch.empty_like(x0)
    copy = _bench(lambda: yc.copy_(x0))
    name = torch.cuda.get_device_name() if DEV == "cuda" else "CPU (TRITON_INTERPRET smoke run)"
    lines = [f"# rmsnorm / layernorm / rope sketch layouts, {name}, bf16", "",
             f"copy y.copy_(x) {SHAPE[0]}x{SHAPE[1]} bf16: {copy * 1e3:.1f} µs", "",
             ("| op | config | kernel µs | kernel+sketch µs | sketch cost | % of copy (sketch) | y same | sketch vs ingest "
              "| special: y same | special vs ingest |"), "|---|---|---:|---:|---:|---:|---|---|---|---|"]
    sel = os.environ.get("BENCH_OPS", ",".join(CONFIGS)).split(",")  # e.g. BENCH_OPS=rope
    for op, cfgs in CONFIGS.items():
        if op not in sel:
            continue
        g = torch.Generator().manual_seed(2)
        inp, params = OPS[op].make(SHAPE, torch.bfloat16, DEV, g)
        sp = _special(op, inp)
        x2 = {k: (v.reshape(-1, v.shape[-1]) if k == "x" and op != "rope" else v) for k, v in inp.items()}
        s2 = {k: (v.reshape(-1, v.shape[-1]) if k == "x" and op != "rope" else v) for k, v in sp.items()}
        y, y0 = torch.empty_like(x2["x"]), torch.empty_like(x2["x"])
        buf = new_buffer(op, DEV)
        for name, cfg in within_budget(cfgs, t0, budget, lines, op, 7):
            try:
                f, f0 = _sweep_launchers(op, x2, params, y, y0, cfg)
                a = _bench(lambda: f0(None))  # noqa: B023
                b = _bench(lambda: f(buf))  # noqa: B023
                same = torch.equal(y.view(torch.int16), y0.view(torch.int16))
                f(buf)
                d = _diff(op, inp, params, buf)
                fs, fs0 = _sweep_launchers(op, s2, params, y, y0, cfg)
                fs(buf)
                fs0(None)
                same_s = torch.equal(y.view(torch.int16), y0.view(torch.int16))
                ds = _diff(op, sp, params, buf)
                lines.append(f"| {op} | {name} | {a * 1e3:.1f} | {b * 1e3:.1f} | {100 * (b / a - 1):+.1f}% | "
                             f"{100 * copy / b:.0f}% | {'yes' if same else 'NO'} | {d} | {'yes' if same_s else 'NO'} | {ds} |")
            except Exception as e:  # noqa: BLE001 - report and go on
                lines.append(f"| {op} | {name} | {type(e).__name__}: {str(e)[:100]} | | | | | | | |")
            print(lines[-1], flush=True)
    return report_tail(lines, t0, "programs per SM:", lambda k: k[0] != "softmax")


if __name__ == "__main__":
    write_report(main(), "sketch_lanes.md")
