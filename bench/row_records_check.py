"""GPU checks of the sketched launches with a program per row (row records polled by a finisher
program, optwin.kernels._common.poll_records): what the interpreter cannot show, on a real GPU where
the programs run concurrently and the finisher spins while rows are still being written.

    python bench/row_records_check.py            # on a CUDA machine; writes $OUT/row_records_check.md
    BENCH_OPS=softmax BENCH_SHAPES=4096x16383,1823x9001 BENCH_NF_WIDTH=16383 python bench/row_records_check.py
    BENCH_OPS=softmax BENCH_SHAPES=8192x8192,7x8191 BENCH_NF_WIDTH=8000 python bench/row_records_check.py  # BLOCK 8192

Per shape and dtype (bench/gpu_kernels.check: NaN-poisoned outputs, float64 math, the production
variant, y bit-identical without the sketch, the sketch against optwin.ingest, a second launch on the
same records), then:
- rows with NaN, ±inf, finite values whose fp32 square overflows, constant and near-constant rows: y against the persistent
  sketched launch (bit for bit) and the sketch against ingest's;
- 200 launches back to back on one stream and on two streams at once, inputs changing: every sketch
  against ingest's (a record left from a launch before, or read before it was written, shows here);
- a CUDA graph of the launch replayed on new inputs;
- every record back at the sentinel at the end, every workspace back at its identities.
BENCH_OPS=softmax runs the same checks on softmax's launches (the row launch at BLOCK 8192 and 16384, the
persistent one elsewhere, whose programs merge into the workspace with atomics); its inputs get -inf
masks and a fully masked row, and its NaN/inf rows HF masks (finfo.min, the HUGE branch) beside -inf and
HUGE values.
Needs torch and numpy (optwin's kernels and ingest are torch + triton).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/

import torch
from _bench_common import watchdog, write_report
from gpu_kernels import _sweep_launcher, check

from optwin.ingest.sketch import sketch as ingest_sketch
from optwin.kernels.sketch_buffer import leftover_state, new_buffer, read_sketch

SHAPES = [(4096, 16384), (1823, 9000), (5, 16384), (70001, 12000), (16384, 4096), (777, 3000), (3001, 5000), (999, 6144)]
# BENCH_SHAPES=4096x16383,1823x9001 checks other shapes (rows no power of two divides: softmax's WINDOW)
if os.environ.get("BENCH_SHAPES"):
    SHAPES = [tuple(int(v) for v in s.split("x")) for s in os.environ["BENCH_SHAPES"].split(",")]
NF_WIDTH = int(os.environ.get("BENCH_NF_WIDTH", "16384"))  # the special rows' width (>= 128)
if NF_WIDTH < 128:  # nonfinite_rows writes past column 100 (checked up front: a stop-35 run lost its report at its end)
    sys.exit(f"row_records_check: BENCH_NF_WIDTH must be at least 128, got {NF_WIDTH}")
NEG_CUT = min(9000, NF_WIDTH - 2)  # row 702: -inf up to here, the lowest value after one normal column
# layernorm: its Welford launch (a program per row where twin.numerics.welford_chunk says; stop 18's one-row
# kernel, commit 014a61d, was reverted)
OPS = tuple(os.environ.get("BENCH_OPS", "rmsnorm,layernorm").split(","))
TOL = 2e-6  # relative, sketch against ingest (float32 row sums, float64 across rows)


def worst(got: dict[str, float], want: dict[str, float]) -> tuple[float, str]:
    """Largest relative difference of two sketches and its key."""
    return max(((abs(got[k] - w) / max(abs(w), 1e-30), k) for k, w in want.items()), default=(0.0, ""))


def launch(op: str, inp: dict[str, torch.Tensor], row_grid: bool = True, sketch: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, sketch buffer or None): the launch with row records (row_grid) or the persistent one."""
    y, buf = torch.empty_like(inp["x"]), new_buffer(op, inp["x"].device) if sketch else None
    cfg = {} if op == "softmax" else {"welford" if op == "layernorm" else "row_grid": row_grid}  # softmax: persistent only
    _sweep_launcher(op, inp, {}, y, cfg)(buf)
    return y, buf


def inputs(op: str, rows: int, n: int, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    inp = {"x": (torch.randn(rows, n, device="cuda", generator=g) * (1 + seed % 7) + seed % 3).to(dtype)}
    if op == "softmax":  # masked entries, a fully masked row
        inp["x"][seed % 5::5, : n // (2 + seed % 3)] = -float("inf")
        inp["x"][rows // 2] = -float("inf")
        return inp
    inp["weight"] = (1 + 0.2 * torch.randn(n, device="cuda", generator=g)).to(dtype)
    if op == "layernorm":
        inp["bias"] = (0.1 * torch.randn(n, device="cuda", generator=g)).to(dtype)
    return inp


def nonfinite_rows(op: str) -> list[str]:
    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        inp = inputs(op, 3000, NF_WIDTH, dtype, 11)
        x = inp["x"]
        x[7, 3], x[900, 0], x[900, 9], x[2999, NF_WIDTH - 1] = float("nan"), float("inf"), -float("inf"), float("nan")
        if dtype != torch.float16:
            x[1500, 5], x[1501, 0] = 3e20, -2e19  # finite, their fp32 squares overflow
        x[100], x[2000], x[511] = 2.5, -96.0, 7.0  # constant rows (layernorm's const_absmax)
        x[513] = x[513] * 1e-3 + 1000.0  # near-constant: |mean|/std past 2^16 in fp32, not constant
        if op == "softmax":  # HF masks (finfo.min: the HUGE branch), beside -inf and HUGE values
            lo = torch.finfo(dtype).min
            x[600:700, 100:] = lo
            x[701, ::3], x[701, 1::3], x[701, 2] = -float("inf"), lo, 1e4 if dtype == torch.float16 else 1e25
            x[702, :NEG_CUT], x[702, NEG_CUT + 1] = -float("inf"), lo
        y, buf = launch(op, inp)
        yp, bufp = launch(op, inp, row_grid=False)
        if op != "rmsnorm":  # layernorm's persistent kernel has other numerics (two trees), softmax has no row grid: y without the sketch
            yp = launch(op, inp, sketch=False)[0]
        got, want = read_sketch(op, buf), ingest_sketch(op, inp)
        d, k = worst(got, want)
        dp, kp = worst(got, read_sketch(op, bufp))
        same = torch.equal(y.view(torch.uint8), yp.view(torch.uint8))
        out.append(f"| {op} | {str(dtype)[6:]} | {int(got['nonfinite'])} / {int(want['nonfinite'])} | {'yes' if same else 'NO'} "
                   f"| {d:.1e} ({k}) | {dp:.1e} ({kp}) | {'ok' if d < TOL and same else 'FAIL'} |")
    return out


def back_to_back(op: str, launches: int = 200) -> list[str]:
    """Launches with changing inputs on one stream, then alternating over two streams; every sketch
    read at the end against ingest's."""
    out = []
    for streams in (1, 2):
        ss = [torch.cuda.current_stream()] + [torch.cuda.Stream() for _ in range(streams - 1)]
        inps = [inputs(op, 1024 + 37 * i, (16384, 12000, 8000)[i % 3], torch.bfloat16, i) for i in range(8)]
        results = []
        for i in range(launches):
            s = ss[i % streams]
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                results.append((i % len(inps), launch(op, inps[i % len(inps)])[1]))
        torch.cuda.synchronize()
        wants = [ingest_sketch(op, inp) for inp in inps]
        bad = [(i, worst(read_sketch(op, buf), wants[j])) for i, (j, buf) in enumerate(results)]
        bad = [(i, d) for i, d in bad if d[0] >= TOL]
        out.append(f"| {op} | {streams} | {launches} | {len(bad)} | {bad[0] if bad else ''} |")
    return out


def graph_replays(op: str) -> list[str]:
    inp = inputs(op, 4096, 16384, torch.bfloat16, 3)
    launch(op, inp)  # compile and create the records outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        launch(op, inp)  # this stream's records
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            _, buf = launch(op, inp)
    torch.cuda.current_stream().wait_stream(s)
    out = []
    for seed in (4, 5, 6):
        inp["x"].copy_(inputs(op, 4096, 16384, torch.bfloat16, seed)["x"])
        graph.replay()
        torch.cuda.synchronize()
        d, k = worst(read_sketch(op, buf), ingest_sketch(op, inp))
        out.append(f"| {op} | {seed} | {d:.1e} ({k}) | {'ok' if d < TOL else 'FAIL'} |")
    return out


def main() -> str:
    lines = [f"# Sketched launches ({', '.join(OPS)}): row records of a program per row; softmax its persistent launch; {torch.cuda.get_device_name()}", ""]
    rows: list[dict[str, Any]] = []
    for op in OPS:
        for shape in SHAPES:
            for dtype in ("bfloat16", "float16", "float32"):
                if shape[0] > 10000 and dtype != "bfloat16":
                    continue
                rows.append(check(op, shape, dtype, "cuda"))
    cols = ["op", "shape", "dtype", "unwritten", "vs_float64", "same_y", "sketch_unwritten", "sketch_vs_ingest", "rerun"]
    lines += ["## gpu_kernels.check", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    lines += ["", f"## Rows with NaN / inf / fp32-square overflow, constant and near-constant rows (3000x{NF_WIDTH})", "",
              "| op | dtype | nonfinite kernel / ingest | y = persistent launch (layernorm: = without the sketch) | sketch vs ingest | vs persistent sketch | |",
              "|---|---|---|---|---|---|---|", *(r for op in OPS for r in nonfinite_rows(op))]
    lines += ["", "## Back to back, changing inputs and row counts", "",
              "| op | streams | launches | sketches off ingest's | first |", "|---|---|---:|---:|---|",
              *(r for op in OPS for r in back_to_back(op))]
    lines += ["", "## CUDA graph replays on new inputs", "", "| op | replay input seed | sketch vs ingest | |",
              "|---|---|---|---|", *(r for op in OPS for r in graph_replays(op))]
    words, n_words, slots, n_slots = leftover_state()
    lines += ["", f"Record words not at the sentinel after everything: {words} (of {n_words})"]
    lines += ["", f"Workspace slots off their identities after everything: {slots} (of {n_slots})"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    watchdog()
    write_report(main(), "row_records_check.md")
