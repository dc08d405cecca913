"""GPU check of softmax over rows past 65536 (optwin.kernels.softmax_long, a vocabulary's logits):
bench/gpu_kernels.py's correctness check (NaN-poisoned outputs, float64 math, torch's softmax, the
ingest sketch, y with and without the sketch) at vocabulary widths, every dtype and mask kind.

    python bench/softmax_long_check.py      # on a CUDA machine; writes $OUT/softmax_long_check.md
    TRITON_INTERPRET=1 python bench/softmax_long_check.py --smoke   # CPU dry run: one width, 2 rows

Timings: BENCH_SHAPE=256x128256 BENCH_OPS=softmax python bench/norm_chunks.py (against torch.compile).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/

import torch
from _bench_common import watchdog, write_report
from gpu_kernels import check

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
SHAPES = [(2, 70001)] if SMOKE else [(5, 128256), (3, 151936), (2, 262144)]  # Llama 3, Qwen 2, Gemma vocabularies


def main() -> int:
    t0 = time.monotonic()
    name = "CPU (TRITON_INTERPRET smoke run)" if SMOKE else torch.cuda.get_device_name()
    lines = [f"# softmax over vocabulary-wide rows on {name}", "",
             "| op | dtype | shape | unwritten | vs float64 | max abs vs production | sketch unwritten | "
             "sketch rel. diff vs ingest | y same w/o sketch | 2nd launch rel. diff |", "|---|---|---|---|---|---|---|---|---|---|"]
    for shape in SHAPES:
        for op in ("softmax", "softmax (no mask)", "softmax (hf mask)"):
            for dt in ("bfloat16", "float16", "float32"):
                try:
                    r = check(op, shape, dt, DEV)
                    lines.append(f"| {op} | {dt} | {r['shape']} | {r['unwritten']} | {r['vs_float64']} | "
                                 f"{r['max_abs_vs_production']:.3g} | {r['sketch_unwritten']} | {r['sketch_vs_ingest']} | "
                                 f"{r['same_y']} | {r['rerun']:.1e} |")
                except Exception as e:  # noqa: BLE001 - report and go on
                    lines.append(f"| {op} | {dt} | {shape[0]}x{shape[1]} | {type(e).__name__}: {str(e)[:200]} |||||||")
    lines.append(f"\ntorch {torch.__version__}; wall {time.monotonic() - t0:.0f} s")
    write_report("\n".join(lines) + "\n", "softmax_long_check.md")
    return 0


if __name__ == "__main__":
    watchdog()
    raise SystemExit(main())
