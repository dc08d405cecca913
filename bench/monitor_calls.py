"""The monitor's host cost per watched call, on a model whose own work is nearly nothing (4 blocks of
an 8-wide Linear and a LayerNorm, one row, float32, one CPU thread): what a call costs the monitor
when its sampling skips it, against the model as is and a frozen revision, in interleaved rounds.

    python bench/monitor_calls.py                           # writes $OUT/monitor_calls.md when $OUT is set
    python bench/ab_snapshot.py base --rev <rev> && BENCH_AB=base python bench/monitor_calls.py

bench/monitor_host.py times the same on a Llama, where the model's own time (and this machine's
noise) is 10x larger than the monitor's.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/
sys.path.insert(2, str(Path(__file__).resolve().parent / ".ab"))  # frozen revisions (bench/ab_snapshot.py)

import torch
from _bench_common import write_report

CALLS_PER_FORWARD = 8  # 4 x (F.linear, F.layer_norm)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.lin(x))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--forwards", type=int, default=2000)
    ap.add_argument("--db", default=str(Path(__file__).resolve().parent / ".ab" / "fp_quick.duckdb"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(_Block() for _ in range(4))).eval()
    x = torch.randn(1, 8)
    pkgs = {"live": importlib.import_module("optwin.monitor")}
    pkgs.update({n: importlib.import_module(f"optwin_{n}.monitor") for n in os.environ.get("BENCH_AB", "").split(",") if n})
    res: dict[str, list[float]] = {"as is": [], **{k: [] for k in pkgs}}
    with torch.no_grad():
        for _ in range(args.rounds):
            for name in res:
                mon = pkgs[name].monitor(model, db=args.db).start() if name in pkgs else None
                try:
                    for _ in range(150):  # past the sampling warm-up (100 calls a stream)
                        model(x)
                    t0 = time.perf_counter()
                    for _ in range(args.forwards):
                        model(x)
                    res[name].append((time.perf_counter() - t0) / args.forwards * 1e6)
                finally:
                    if mon is not None:
                        mon.stop()
    base = statistics.median(res["as is"])
    lines = [f"# The monitor's cost per watched call (unsampled), {args.rounds} interleaved rounds of {args.forwards} "
             f"forwards, {CALLS_PER_FORWARD} calls each; torch {torch.__version__}", "",
             "| config | µs per forward (median) | min | µs per call over the model as is |", "|---|---:|---:|---:|"]
    for name, ts in res.items():
        per_call = "" if name == "as is" else f"{(statistics.median(ts) - base) / CALLS_PER_FORWARD:.2f}"
        lines.append(f"| {name} | {statistics.median(ts):.1f} | {min(ts):.1f} | {per_call} |")
    write_report("\n".join(lines) + "\n", "monitor_calls.md")


if __name__ == "__main__":
    main()
