"""The monitor's host cost per forward of a small model on the CPU, where the host is the whole cost
(as in decoding with small batches), against the model as is and against a frozen revision.

    python bench/monitor_host.py                       # writes $OUT/monitor_host.md when $OUT is set
    python bench/ab_snapshot.py base --rev <rev> && BENCH_AB=base python bench/monitor_host.py
    python bench/monitor_host.py --smoke               # one short round (the tests run this)

A Llama built from a config (random weights, transformers' real code: RMSNorm modules, rotary,
eager attention through F.softmax, nn.Linear through F.linear), batch 1 x 16 tokens, no KV cache,
float32 on one CPU thread. Each config starts its monitor (a local matcher over --db: `optwin build
--quick --out bench/.ab/fp_quick.duckdb` makes the default), runs past the sampling warm-up (100 calls
a stream), then times `forwards` forwards. Rounds interleave the configs (a slow spell of a
shared machine hits them alike); the table gives min and median ms per forward over the rounds and
the monitor's cost against the model as is (from the minima: the least disturbed), and the median
process CPU time per forward (time.process_time: on one thread, blind to the time the process sat
descheduled, which dominated the wall-clock spread on this workplace's shared 2-core machines).
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/
sys.path.insert(2, str(Path(__file__).resolve().parent / ".ab"))  # frozen revisions (bench/ab_snapshot.py)

import torch
from _bench_common import write_report

WARMUP = 110  # forwards before timing: past the default sampling's 100-call warm-up per stream


def _model(layers: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=1000, attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval()


def _configs(model: torch.nn.Module, db: str, ab: list[str]) -> dict[str, Callable[[], Any] | None]:
    """name -> a function that returns a started monitor (None: the model as is)."""
    pkgs = {"live": importlib.import_module("optwin.monitor")}
    pkgs.update({name: importlib.import_module(f"optwin_{name}.monitor") for name in ab})
    out: dict[str, Callable[[], Any] | None] = {"as is": None}
    for tag, om in pkgs.items():
        for label, ops in (("rmsnorm, rope", ("rmsnorm", "rope")), ("all ops", None)):
            out[f"{tag}: monitor ({label})"] = (lambda om=om, ops=ops: om.monitor(model, db=db, ops=ops))
    return out


def run(layers: int, rounds: int, forwards: int, warmup: int, db: str, ab: list[str]) -> list[str]:
    torch.set_num_threads(1)
    model = _model(layers)
    ids = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(1))
    cfgs = _configs(model, db, ab)
    times: dict[str, list[float]] = {k: [] for k in cfgs}
    cpu: dict[str, list[float]] = {k: [] for k in cfgs}  # process CPU time: blind to the time descheduled
    checked: dict[str, int] = {}
    with torch.no_grad():
        for _ in range(rounds):
            for name, start in cfgs.items():
                mon = start() if start is not None else None
                if mon is not None:
                    mon.start()
                try:
                    for _ in range(warmup if mon is not None else 1):
                        model(ids, use_cache=False)
                    if mon is not None:
                        mon.flush()
                        before = mon.stats.checked
                    t0, c0 = time.perf_counter(), time.process_time()
                    for _ in range(forwards):
                        model(ids, use_cache=False)
                    times[name].append((time.perf_counter() - t0) / forwards * 1e3)
                    cpu[name].append((time.process_time() - c0) / forwards * 1e3)
                    if mon is not None:
                        mon.flush()
                        checked[name] = mon.stats.checked - before
                finally:
                    if mon is not None:
                        mon.stop()
    base, cbase = min(times["as is"]), statistics.median(cpu["as is"])
    lines = ["| config | ms per forward (min) | median | monitor cost (min) | CPU ms per forward (median) | "
             "monitor cost (CPU) | calls checked while timed |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, ts in times.items():
        cost = "" if name == "as is" else f"{min(ts) - base:+.3f} ms ({100 * (min(ts) / base - 1):+.0f} %)"
        c = statistics.median(cpu[name])
        ccost = "" if name == "as is" else f"{c - cbase:+.3f} ms ({100 * (c / cbase - 1):+.0f} %)"
        lines.append(f"| {name} | {min(ts):.3f} | {statistics.median(ts):.3f} | {cost} | {c:.3f} | {ccost} | "
                     f"{checked.get(name, '')} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--forwards", type=int, default=100)
    ap.add_argument("--db", default=str(Path(__file__).resolve().parent / ".ab" / "fp_quick.duckdb"),
                    help="fingerprint database (default: bench/.ab/fp_quick.duckdb from optwin build --quick)")
    ap.add_argument("--smoke", action="store_true", help="one short round: the tests run the script")
    args = ap.parse_args()
    ab = [n for n in os.environ.get("BENCH_AB", "").split(",") if n]
    t0 = time.monotonic()
    rounds, forwards, warmup = (1, 3, 2) if args.smoke else (args.rounds, args.forwards, WARMUP)
    lines = [f"# The monitor's host cost: Llama from a config ({args.layers} layers, hidden 256), batch 1 x 16 "
             f"tokens, float32, 1 CPU thread; {rounds} interleaved rounds of {forwards} forwards after {warmup} "
             f"warm-up forwards; database: {Path(args.db).name}", ""]
    lines += run(args.layers, rounds, forwards, warmup, args.db, ab)
    lines += ["", f"torch {torch.__version__}; wall {time.monotonic() - t0:.0f} s"]
    write_report("\n".join(lines) + "\n", "monitor_host.md")


if __name__ == "__main__":
    main()
