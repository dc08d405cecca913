"""layernorm's Welford row launch with its finisher deferred (optwin.kernels.deferred) against the finisher in
the launch and the launch without the sketch, with launch overrides of the deferred form, timed side by side in
interleaved rounds.

    python bench/ln_deferred.py                                     # on a CUDA machine; writes $OUT/ln_deferred.md
    BENCH_SHAPES=4096x16384 BENCH_DTYPE=float16 BENCH_CONFIGS='[{"maxnreg": 32}]' python bench/ln_deferred.py
    TRITON_INTERPRET=1 python bench/ln_deferred.py --smoke          # CPU dry run, one small shape, no timing
    python bench/ln_deferred.py --trace                             # the entries back to back under torch.profiler

µs per call, median over rounds, of BENCH_CALLS calls (default deferred.PAGE_CALLS) between two events: back to back (how a model's
layers run them, the settles included) and queued behind a GPU sleep (GPU ahead: the host's launch time cannot
show). Each deferred entry is checked against the in-launch finisher: y and every feature bit for bit.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))

import torch
from _bench_common import (
    AHEAD_CYCLES,
    TRACE_HEADER,
    config_name,
    deferred_verdict,
    env_shapes,
    events_ms,
    traced_windows,
    watchdog,
    write_report,
)
from gpu_kernels import OPS

from optwin.kernels import deferred
from optwin.kernels.layernorm import EPS, _layernorm_launch
from optwin.kernels.sketch_buffer import new_buffer

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
SHAPES = env_shapes("8x4096" if SMOKE else "4096x16384,8192x8192,16384x4096,2048x32768")
DTYPE = getattr(torch, os.environ.get("BENCH_DTYPE", "bfloat16"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))
# calls a window (default a page's: one settle a window; more windows' settles land mid-window, with the GPU busy)
CALLS = int(os.environ.get("BENCH_CALLS", deferred.PAGE_CALLS))
# launch overrides of the deferred form (_layernorm_launch's keywords), each its own entry
CONFIGS: list[dict] = json.loads(os.environ.get("BENCH_CONFIGS") or "[]")


def _entries(inp: dict[str, torch.Tensor], y: torch.Tensor) -> dict[str, object]:
    x, w, b = inp["x"], inp["weight"], inp["bias"]
    buf = new_buffer("layernorm", x.device)
    entries = {
        "no sketch": lambda: _layernorm_launch(x, w, b, y, None, EPS),
        "finisher in the launch": lambda: _layernorm_launch(x, w, b, y, buf, EPS),
        "deferred": lambda: _layernorm_launch(x, w, b, y, None, EPS, defer=True),
    }
    for cfg in CONFIGS:
        entries[f"deferred {config_name(cfg)}"] = lambda cfg=cfg: _layernorm_launch(x, w, b, y, None, EPS, defer=True,
                                                                                     **cfg)
    return entries


def _check(inp: dict[str, torch.Tensor], cfg: dict) -> str:
    """'ok' where the deferred launch's y and features are the in-launch finisher's, bit for bit."""
    x, w, b = inp["x"], inp["weight"], inp["bias"]
    y0, y1 = torch.empty_like(x), torch.empty_like(x)
    b0 = new_buffer("layernorm", x.device)
    _layernorm_launch(x, w, b, y0, b0, EPS)
    b1 = _layernorm_launch(x, w, b, y1, None, EPS, defer=True, **cfg)
    return deferred_verdict("layernorm", x.shape, y0, b0, y1, b1)


def main() -> None:
    g = torch.Generator().manual_seed(6)
    name = torch.cuda.get_device_name() if not SMOKE else "CPU (TRITON_INTERPRET smoke run)"
    lines = [f"# layernorm: deferred finishing against the finisher in the launch; {name}, {DTYPE}", "",
             f"Command: `BENCH_SHAPES={','.join(f'{r}x{c}' for r, c in SHAPES)} BENCH_DTYPE={str(DTYPE)[6:]} "
             f"BENCH_ROUNDS={ROUNDS} BENCH_CALLS={CALLS} BENCH_CONFIGS='{json.dumps(CONFIGS)}' python bench/ln_deferred.py`", "",
             f"µs per call of {CALLS} calls (a page: {deferred.PAGE_CALLS}), median over {ROUNDS} interleaved rounds; cost: against the "
             "launch without the sketch", "",
             "| shape | launch | back to back µs | cost | GPU ahead µs | cost | deferred = in the launch |",
             "|---|---|---:|---:|---:|---:|---|"]
    for shape in SHAPES:
        inp, _ = OPS["layernorm"].make(shape, DTYPE, DEV, g)
        y = torch.empty_like(inp["x"])
        entries = _entries(inp, y)
        checks = {"deferred": _check(inp, {}), **{f"deferred {config_name(c)}": _check(inp, c) for c in CONFIGS}}
        b2b: dict[str, list[float]] = {k: [] for k in entries}
        ahead: dict[str, list[float]] = {k: [] for k in entries}
        for _ in range(0 if SMOKE else ROUNDS):
            for k, fn in entries.items():
                b2b[k].append(events_ms(fn, flush=False, sleep=False, calls=CALLS, reps=1) * 1e3)
                ahead[k].append(events_ms(fn, flush=False, sleep=AHEAD_CYCLES, calls=CALLS, reps=1) * 1e3)
        deferred.settle_all()
        if SMOKE:
            lines += [f"| {shape[0]}x{shape[1]} | {k} | - | - | - | - | {checks.get(k, '-')} |" for k in entries]
            continue
        base_b, base_a = statistics.median(b2b["no sketch"]), statistics.median(ahead["no sketch"])
        for k in entries:
            bb, aa = statistics.median(b2b[k]), statistics.median(ahead[k])
            lines.append(f"| {shape[0]}x{shape[1]} | {k} | {bb:.1f} | {100 * (bb / base_b - 1):+.1f}% | {aa:.1f} | "
                         f"{100 * (aa / base_a - 1):+.1f}% | {checks.get(k, '-')} |")
    left = deferred.leftover()
    lines += ["", f"records / workspace slots off rest after settle_all: {'none' if left == (0, 0) else left}",
              "", f"torch {torch.__version__}"]
    write_report("\n".join(lines) + "\n", "ln_deferred.md")


def trace() -> None:
    """--trace: _bench_common.traced_windows over every entry at each shape."""
    g = torch.Generator().manual_seed(6)
    lines = [TRACE_HEADER]
    for shape in SHAPES:
        inp, _ = OPS["layernorm"].make(shape, DTYPE, DEV, g)
        for name, fn in _entries(inp, torch.empty_like(inp["x"])).items():
            lines.append(traced_windows(fn, f"{shape[0]}x{shape[1]}", name, deferred.PAGE_CALLS))
    write_report("\n".join([f"# layernorm: deferred finishing back to back, traced; {torch.cuda.get_device_name()}",
                             "", f"Command: `BENCH_SHAPES={','.join(f'{r}x{c}' for r, c in SHAPES)} python "
                             "bench/ln_deferred.py --trace`", ""] + lines) + "\n", "ln_deferred_trace.md")


if __name__ == "__main__":
    if not SMOKE:
        watchdog()
    trace() if "--trace" in sys.argv else main()
