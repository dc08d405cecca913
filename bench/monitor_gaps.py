"""Where the monitor's cost on a patched Llama goes on the GPU: kernel time against idle time, by
torch.profiler, for the patched model alone, under a monitor at the default sampling, and alone again.

    python bench/monitor_gaps.py --db fp_quick.duckdb     # on a CUDA machine; writes $OUT/monitor_gaps.md

The model of bench/monitor_fused.py (hidden 2048, 4 layers, bf16, 8 x 2048 tokens, no KV cache), 10
profiled forwards per config after the monitor's sampling warm-up. Wall time minus the summed kernel
time is time the GPU waited for the host.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/

import torch
from _bench_common import write_report
from monitor_fused import OPS, SAMPLING_WARMUP, build_llama

import optwin.kernels
import optwin.monitor as om


def measure(model: torch.nn.Module, ids: torch.Tensor, name: str, n: int) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            model(ids)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / n * 1e3
    ev = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    kern = sum(e.self_device_time_total for e in ev) / n / 1e3
    top = sorted(ev, key=lambda e: -e.self_device_time_total)[:8]
    return [f"## {name}: wall {wall:.2f} ms per forward, GPU kernels {kern:.2f} ms, GPU idle {wall - kern:.2f} ms", "",
            *(f"- {e.key[:90]}: {e.self_device_time_total / n / 1e3:.3f} ms, {e.count // n} calls" for e in top), "",
            *_gaps(prof, n), ""]


def _gaps(prof: object, n: int) -> list[str]:
    """GPU idle between kernels (within the profiled span), by the kernel that ends each gap."""
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()  # type: ignore[attr-defined]
                   if e.device_type.name == "CUDA")
    by_next: dict[str, list[float]] = {}
    end = spans[0][1] if spans else 0.0
    for start, stop, name in spans[1:]:
        if start > end:
            by_next.setdefault(name[:70], []).append(start - end)
        end = max(end, stop)
    total = sum(sum(g) for g in by_next.values()) / n / 1e3
    worst = sorted(by_next.items(), key=lambda kv: -sum(kv[1]))[:8]
    return [f"GPU idle between its first and last kernel: {total:.3f} ms per forward; by the kernel after the gap:", "",
            *(f"- {k}: {sum(g) / n:.1f} µs per forward over {len(g) // n} gaps (largest {max(g):.1f} µs)" for k, g in worst)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="a fingerprint database (optwin build --quick makes one)")
    ap.add_argument("--forwards", type=int, default=10)
    args = ap.parse_args()
    model = build_llama(False, "cuda", torch.bfloat16)
    model.config.use_cache = False
    ids = torch.randint(0, model.config.vocab_size, (8, 2048), generator=torch.Generator().manual_seed(1)).cuda()
    lines = [f"# The monitor on a patched Llama: GPU kernel time and idle time; {torch.cuda.get_device_name()}", ""]
    with torch.no_grad():
        handle = optwin.kernels.patch(model)
        try:
            for _ in range(3):
                model(ids)
            lines += measure(model, ids, "patched", args.forwards)
            with om.monitor(model, db=args.db, ops=OPS) as mon:
                for _ in range(SAMPLING_WARMUP):
                    model(ids)
                mon.flush()
                lines += measure(model, ids, "patched + monitor, default sampling", args.forwards)
            lines += measure(model, ids, "patched again", args.forwards)
        finally:
            handle.undo()
    write_report("\n".join(lines) + "\n", "monitor_gaps.md")


if __name__ == "__main__":
    main()
