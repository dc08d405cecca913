"""Softmax sketch layouts timed against each other on one GPU (issue #6: the fused sketch's cost).

    BENCH_BUDGET_S=120 python bench/softmax_sketch.py   # on a CUDA machine; writes $OUT/softmax_sketch.md
    BENCH_BUDGET_S=0 BENCH_CHECK_S=120 python bench/softmax_sketch.py   # the odd-shape checks only

Last runs: bench/results/softmax_sketch_h200.md (variants 0-3), bench/results/softmax_sketch_h200_s11.md
and _s11b.md (variants 3-6: the per-lane accumulators of issue #6), _s11c.md (layouts 4 and 8 on both inputs),
_s11e.md (layouts 8 and 4 after the clean-up), softmax_sketch_h200_s21a/b.md and softmax_checks_h200_s21*.md
(layout 10, 16-bit pairs, the default for bf16/fp16 since stop 21; the "hf mask" input). The kernel keeps
layouts 3, 4, 8 and 10 (softmax.LAYOUTS); 0-2 and 5-7 were measured and dropped (their numbers are in
optwin/kernels/softmax.py's comment block).

For each launch config (softmax.VARIANT x num_warps x stages x FMA fusion x register cap) at
4096x16384 bf16, on the masked timing input (column 1 is -inf in every row, the worst case for the
-inf selects) and on the same input without the mask ("no mask": layout 8's select-free branch): the kernel
without and with the sketch (triton.testing.do_bench, median, L2 flushed), whether y is
bit-identical between the two, each compiled kernel's programs per SM, and the
largest relative difference of the sketch vs optwin.ingest.sketch on the timing input and on a
16384-wide input with NaN/+inf/huge/masked rows (the slow path).
Needs torch and triton only (the optwin modules it imports are pure Python + torch).
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/, for `_bench_common`

import torch
from _bench_common import report_tail, worst_diff, write_report

from optwin.kernels.sketch_buffer import new_buffer, read_sketch

# (variant, num_warps, stages, enable_fp_fusion, maxnreg: None = softmax.MAXNREG, 0 = no cap), variant
# one of softmax.LAYOUTS; (3, 16, 1, False, None) was the default before the lane accumulators,
# (4, 16, 1, False, None) is
CONFIGS = [(10, 16, 1, True, None), (10, 16, 1, False, None), (4, 16, 1, False, None), (10, 16, 1, True, 0)]
# session 11c: layout 8 (a select-free branch for rows without -inf) on both inputs; earlier sweeps
# timed layout 3 at 16 warps (fused 120.0 µs) and layout 4 uncapped (167.0) and at 8 warps, 128
# registers (135.8), and the layouts since removed from the kernel: 5 (384.3), 6 (118.4, fused
# 117.6) and 7 (in an earlier CONFIGS, no GPU timing on record)
# stop 21: layout 10 (16-bit pairs), fused and not, against layout 4, and uncapped
LAYOUTS = (10, 4)  # checked at the odd shapes (the default's launch), while the budget lasts; 10 where packable
# correctness of the new layouts at the tuned launch of other row lengths (BLOCK 1024, 2048, 65536)
ODD_SHAPES = [(1823, 781), (1823, 782), (7, 1025), (7, 1026), (3, 65536), (4096, 16384)]
SHAPE = (4096, 16384)


def _timing_input(g: torch.Generator) -> torch.Tensor:
    """bench/gpu_kernels.py's softmax input: rows from flat to peaked, one masked column."""
    temp = torch.logspace(0, 2, SHAPE[0]).reshape(-1, 1)
    x = (temp * torch.randn(*SHAPE, generator=g)).to(torch.bfloat16)
    x[:, 1] = -math.inf
    return x.cuda()


def _unmasked(x: torch.Tensor) -> torch.Tensor:
    """The timing input without its masked column (logits with no -inf: e.g. sampling over a vocabulary)."""
    u = x.clone()
    u[:, 1] = u[:, 2]
    return u


def _hf_masked(x: torch.Tensor) -> torch.Tensor:
    """The unmasked timing input with HF's eager causal mask: row r keeps its first (r+1)/rows of
    columns, the rest finfo.min (whose square overflows float32: softmax.HUGE's branch)."""
    u = _unmasked(x)
    keep = torch.arange(1, u.shape[0] + 1, device=u.device)[:, None] * u.shape[1] // u.shape[0]
    cols = torch.arange(u.shape[1], device=u.device)[None, :]
    return torch.where(cols < keep, u, torch.finfo(u.dtype).min)


def _special_input(g: torch.Generator) -> torch.Tensor:
    """Rows for the slow path and the masks: NaN, +inf, huge (squares overflow), fully/partly masked."""
    x = torch.randn(300, SHAPE[1], generator=g) * torch.logspace(0, 2, 300)[:, None]
    x[1, 17] = float("nan")
    x[2, 3] = float("inf")
    x[3] = -math.inf
    x[4, :8000] = -math.inf
    x[5, 40] = 1e20
    x[6, 41] = -3e17
    x[7, :-1] = -math.inf
    x[150, 9] = float("nan")
    x[151] = -math.inf
    x[152] = torch.finfo(torch.bfloat16).min  # a fully HF-masked row with -inf beside: its max is the lowest value
    x[152, :5] = -math.inf
    x[153, 100:] = torch.finfo(torch.bfloat16).min
    return x.to(torch.bfloat16).cuda()


_WANT: dict[str, dict[str, float]] = {}


def _diff(x: torch.Tensor, buf: torch.Tensor, key: str = "") -> str:
    """Largest relative difference of the kernel's sketch vs ingest's (cached under `key`)."""
    from optwin.ingest.sketch import sketch as ingest_sketch

    want = _WANT.get(key) if key else None
    if want is None:  # ingest's float64 sketch: seconds on CPU at the timing shape
        want = ingest_sketch("softmax", {"x": x.cpu()})
        if key:
            _WANT[key] = want
    return worst_diff(read_sketch("softmax", buf, x.shape), want)


def main() -> str:
    import triton.testing

    from optwin.kernels.softmax import _softmax_launch

    t0, budget = time.monotonic(), float(os.environ.get("BENCH_BUDGET_S", "120"))
    g = torch.Generator().manual_seed(2)
    x, xs = _timing_input(g), _special_input(g)
    y1, y0 = torch.empty_like(x), torch.empty_like(x)
    buf = new_buffer("softmax", x.device)
    copy = triton.testing.do_bench(lambda: y0.copy_(x), return_mode="median")
    head = ("| variant | warps | stages | fusion | maxnreg | input | kernel µs | kernel+sketch µs | sketch cost | % of copy "
            "(sketch) | y same | sketch vs ingest | special rows: y same | special vs ingest |")
    lines = [f"# softmax sketch layouts, {torch.cuda.get_device_name()}, {SHAPE[0]}x{SHAPE[1]} bf16", "",
             f"copy y.copy_(x): {copy * 1e3:.1f} µs", "", head, "|---|---|---|---|---|---|---:|---:|---:|---:|---|---|---|---|"]
    inputs = {"masked": x, "no mask": _unmasked(x), "hf mask": _hf_masked(x)}
    for var, w, st, fu, cap in CONFIGS:
        for name, xi in inputs.items():
            pre = f"| {var} | {w} | {st} | {int(fu)} | {'table' if cap is None else cap or 'none'} | {name} |"
            if time.monotonic() - t0 > budget:
                lines.append(f"{pre} skipped: budget spent | | | | | | | |")
                continue
            try:
                kw = {"num_warps": w, "stages": st, "variant": var, "fusion": fu, "maxnreg": cap}
                a = triton.testing.do_bench(lambda: _softmax_launch(xi, y0, None, **kw), return_mode="median")  # noqa: B023
                b = triton.testing.do_bench(lambda: _softmax_launch(xi, y1, buf, **kw), return_mode="median")  # noqa: B023
                same = torch.equal(y1.view(torch.int16), y0.view(torch.int16))
                _softmax_launch(xi, y1, buf, **kw)
                d = _diff(xi, buf, name)
                s1, s0 = torch.empty_like(xs), torch.empty_like(xs)
                _softmax_launch(xs, s1, buf, **kw)
                _softmax_launch(xs, s0, None, **kw)
                same_s = torch.equal(s1.view(torch.int16), s0.view(torch.int16))
                ds = _diff(xs, buf, "special")
                lines.append(f"{pre} {a * 1e3:.1f} | {b * 1e3:.1f} | {100 * (b / a - 1):+.1f}% | {100 * copy / b:.0f}% | "
                             f"{'yes' if same else 'NO'} | {d} | {'yes' if same_s else 'NO'} | {ds} |")
            except Exception as e:  # noqa: BLE001 - report and go on
                lines.append(f"{pre} {type(e).__name__}: {str(e)[:80]} | | | | | | | |")
            print(lines[-1], flush=True)
    lines += ["", "| variant | shape | y same | sketch vs ingest |", "|---|---|---|---|"]
    for var in LAYOUTS:
        for shp in ODD_SHAPES:
            if time.monotonic() - t0 > budget + float(os.environ.get("BENCH_CHECK_S", "30")):
                lines.append(f"| {var} | {shp[0]}x{shp[1]} | skipped: budget spent | |")
                continue
            if var == 10 and shp[1] % 2:
                continue  # layout 10 reads pairs: odd rows keep layout 4
            try:
                xo = torch.randn(*shp, generator=g).mul(3).to(torch.bfloat16).cuda()
                xo[1::2, 1] = -math.inf  # odd rows masked (layout 8's select branch), even rows not
                xo[0, 2] = float("nan")
                xo[-1] = -math.inf
                if shp[0] > 3:  # row 2 (not masked): h - m overflows to -inf, the redo recounts peaked
                    xo[2, 0], xo[2, 3] = 3e38, -3e38
                o1, o0 = torch.empty_like(xo), torch.empty_like(xo)
                _softmax_launch(xo, o1, buf, variant=var)
                _softmax_launch(xo, o0, None, variant=var)
                same = torch.equal(o1.view(torch.int16), o0.view(torch.int16))
                lines.append(f"| {var} | {shp[0]}x{shp[1]} | {'yes' if same else 'NO'} | {_diff(xo, buf)} |")
            except Exception as e:  # noqa: BLE001
                lines.append(f"| {var} | {shp[0]}x{shp[1]} | {type(e).__name__}: {str(e)[:80]} | |")
    return report_tail(lines, t0, "programs per SM (key: op, dtypes, BLOCK, warps, stages, sketch, variant, "
                       "fusion, maxnreg, keep, even):", lambda k: k[0] == "softmax")


if __name__ == "__main__":
    write_report(main(), "softmax_sketch.md")
