"""GPU checks of the sketched launches with a program per row (row records polled by a finisher
program, optwin.kernels._common.poll_records): what the interpreter cannot show, on a real GPU where
the programs run concurrently and the finisher spins while rows are still being written.

    python bench/row_records_check.py            # on a CUDA machine; writes $OUT/row_records_check.md

Per shape and dtype (bench/gpu_kernels.check: NaN-poisoned outputs, float64 math, the production
variant, y bit-identical without the sketch, the sketch against optwin.ingest, a second launch on the
same records), then:
- rows with NaN, ±inf and finite values whose fp32 square overflows: y against the persistent
  sketched launch (bit for bit) and the sketch against ingest's;
- 200 launches back to back on one stream and on two streams at once, inputs changing: every sketch
  against ingest's (a record left from a launch before, or read before it was written, shows here);
- a CUDA graph of the launch replayed on new inputs;
- every record back at the sentinel at the end.
Needs torch and numpy (optwin's kernels and ingest are torch + triton).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/

import torch
from _bench_common import write_report
from gpu_kernels import check

from optwin.ingest.sketch import sketch as ingest_sketch
from optwin.kernels.rmsnorm import EPS, _rmsnorm_launch
from optwin.kernels.sketch_buffer import _RECORDS, SENTINEL, new_buffer, read_sketch

SHAPES = [(4096, 16384), (1823, 9000), (5, 16384), (70001, 12000)]
TOL = 1e-6  # relative, sketch against ingest (float32 row sums, float64 across rows)


def worst(got: dict[str, float], want: dict[str, float]) -> tuple[float, str]:
    """Largest relative difference of two sketches and its key."""
    return max(((abs(got[k] - w) / max(abs(w), 1e-30), k) for k, w in want.items()), default=(0.0, ""))


def launch(x: torch.Tensor, w: torch.Tensor, row_grid: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    y, buf = torch.empty_like(x), new_buffer("rmsnorm", x.device)
    _rmsnorm_launch(x, w, y, buf, EPS, row_grid=row_grid)
    return y, buf


def inputs(rows: int, n: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(rows, n, device="cuda", generator=g) * (1 + seed % 7)).to(dtype)
    w = (1 + 0.2 * torch.randn(n, device="cuda", generator=g)).to(dtype)
    return x, w


def nonfinite_rows() -> list[str]:
    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x, w = inputs(3000, 16384, dtype, 11)
        x[7, 3], x[900, 0], x[900, 9], x[2999, 16383] = float("nan"), float("inf"), -float("inf"), float("nan")
        if dtype != torch.float16:
            x[1500, 5], x[1501, 0] = 3e20, -2e19  # finite, their fp32 squares overflow
        y, buf = launch(x, w)
        yp, bufp = launch(x, w, row_grid=False)
        got, want = read_sketch("rmsnorm", buf), ingest_sketch("rmsnorm", {"x": x, "weight": w})
        d, k = worst(got, want)
        dp, kp = worst(got, read_sketch("rmsnorm", bufp))
        same = torch.equal(y.view(torch.uint8), yp.view(torch.uint8))
        out.append(f"| {str(dtype)[6:]} | {int(got['nonfinite'])} / {int(want['nonfinite'])} | {'yes' if same else 'NO'} "
                   f"| {d:.1e} ({k}) | {dp:.1e} ({kp}) | {'ok' if d < TOL and same else 'FAIL'} |")
    return ["| dtype | nonfinite kernel / ingest | y = persistent launch | sketch vs ingest | vs persistent sketch | |",
            "|---|---|---|---|---|---|", *out]


def back_to_back(launches: int = 200) -> list[str]:
    """Launches with changing inputs on one stream, then alternating over two streams; every sketch
    read at the end against ingest's."""
    out = []
    for streams in (1, 2):
        ss = [torch.cuda.current_stream()] + [torch.cuda.Stream() for _ in range(streams - 1)]
        xs = [inputs(1024 + 37 * i, 16384 if i % 2 else 12000, torch.bfloat16, i) for i in range(8)]
        results = []
        for i in range(launches):
            s = ss[i % streams]
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                x, w = xs[i % len(xs)]
                results.append((i % len(xs), launch(x, w)[1]))
        torch.cuda.synchronize()
        wants = [ingest_sketch("rmsnorm", {"x": x, "weight": w}) for x, w in xs]
        bad = [(i, worst(read_sketch("rmsnorm", buf), wants[j])) for i, (j, buf) in enumerate(results)]
        bad = [(i, d) for i, d in bad if d[0] >= TOL]
        out.append(f"| {streams} | {launches} | {len(bad)} | {bad[0] if bad else ''} |")
    return ["| streams | launches | sketches off ingest's | first |", "|---|---:|---:|---|", *out]


def graph_replays() -> list[str]:
    x, w = inputs(4096, 16384, torch.bfloat16, 3)
    static_x = x.clone()
    launch(static_x, w)  # compile and create the records outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        launch(static_x, w)  # this stream's records
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            _, buf = launch(static_x, w)
    torch.cuda.current_stream().wait_stream(s)
    out = []
    for seed in (4, 5, 6):
        static_x.copy_(inputs(4096, 16384, torch.bfloat16, seed)[0])
        graph.replay()
        torch.cuda.synchronize()
        d, k = worst(read_sketch("rmsnorm", buf), ingest_sketch("rmsnorm", {"x": static_x, "weight": w}))
        out.append(f"| {seed} | {d:.1e} ({k}) | {'ok' if d < TOL else 'FAIL'} |")
    return ["| replay input seed | sketch vs ingest | |", "|---|---|---|", *out]


def main() -> str:
    lines = [f"# Row records (rmsnorm, a program per row with the sketch); {torch.cuda.get_device_name()}", ""]
    rows: list[dict[str, Any]] = []
    for shape in SHAPES:
        for dtype in ("bfloat16", "float16", "float32"):
            if shape[0] > 10000 and dtype != "bfloat16":
                continue
            rows.append(check("rmsnorm", shape, dtype, "cuda"))
    cols = ["shape", "dtype", "unwritten", "vs_float64", "same_y", "sketch_unwritten", "sketch_vs_ingest", "rerun"]
    lines += ["## gpu_kernels.check", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    lines += ["", "## Rows with NaN / inf / fp32-square overflow (3000x16384)", "", *nonfinite_rows()]
    lines += ["", "## Back to back, changing inputs and row counts", "", *back_to_back()]
    lines += ["", "## CUDA graph replays on new inputs", "", *graph_replays()]
    torch.cuda.synchronize()
    left = sum(int((words != SENTINEL).sum()) for words, _ in _RECORDS.values())
    lines += ["", f"Record words not at the sentinel after everything: {left} (of {sum(words.numel() for words, _ in _RECORDS.values())})"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    write_report(main(), "row_records_check.md")
