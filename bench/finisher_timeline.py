"""Where a row launch's finisher spends the kernel's end: globaltimer stamps of every row program's start and
end and of each finisher poll, a sketched launch with a program per row (softmax at softmax.ROWS_BLOCKS,
layernorm's Welford launch) against the launch without the sketch, L2 flushed before each launch as do_bench
flushes it.

    python bench/finisher_timeline.py                      # softmax bf16 4096x16384; writes $OUT/finisher_timeline.md
    BENCH_SHAPE=8192x8192 BENCH_CONFIGS='[{}, {"poll": 128}]' python bench/finisher_timeline.py
    BENCH_OP=layernorm BENCH_SHAPE=16384x4096 python bench/finisher_timeline.py
    TRITON_INTERPRET=1 python bench/finisher_timeline.py --smoke   # CPU dry run, 64x512 (the stamps read 0 there)

Per config, medians over the launches (µs, from the first row's start): the last row's end, the finisher's
last poll in and its end, the gap from the last row's end to the finisher's end (what the finisher adds to the
kernel), each poll's wait after its own rows' last end. The stamps are the kernel's PROBE 131072 (bench only; it
changes nothing else). The kernel's time is norm_chunks.py's (do_bench); the stamps say where in it things happen.
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
from _bench_common import config_name, watchdog, write_report
from gpu_kernels import OPS

from optwin.kernels import layernorm as layernorm_mod
from optwin.kernels import softmax as softmax_mod
from optwin.kernels._common import RECORD_POLL, cdiv
from optwin.kernels.sketch_buffer import new_buffer, reset_state

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
SHAPE = tuple(int(v) for v in os.environ.get("BENCH_SHAPE", "64x512" if SMOKE else "4096x16384").split("x"))
CONFIGS = json.loads(os.environ.get("BENCH_CONFIGS", "[{}]"))
OP = os.environ.get("BENCH_OP", "softmax")
LAUNCHES = 3 if SMOKE else int(os.environ.get("BENCH_LAUNCHES", "20"))
STAMPS = 131072


def _launch(inp: dict, y: torch.Tensor, buf: torch.Tensor | None, stamps: torch.Tensor, cfg: dict) -> None:
    if OP == "softmax":
        softmax_mod._softmax_launch(inp["x"], y, buf, timestamps=stamps, **cfg)
    else:
        layernorm_mod._layernorm_launch(inp["x"], inp["weight"], inp["bias"], y, buf, layernorm_mod.EPS,
                                        timestamps=stamps, **cfg)


def _timeline(inp: dict, y: torch.Tensor, sketch: bool, cfg: dict, flush: torch.Tensor | None) -> dict:
    """One launch's stamps, as µs from its first row's start."""
    x = inp["x"]
    n_rows = x.shape[0]
    cfg = dict(cfg)
    poll = cfg.get("poll") or RECORD_POLL
    polls = cdiv(n_rows, poll)
    stamps = torch.zeros(2 * n_rows + polls + 1, dtype=torch.int64, device=x.device)
    buf = new_buffer(OP, x.device) if sketch else None
    cfg["probe"] = cfg.get("probe", 0) | STAMPS
    if flush is not None:
        flush.zero_()
    _launch(inp, y, buf, stamps, cfg)
    t = stamps.cpu().double() / 1e3
    begin, ends = t[:n_rows], t[n_rows:2 * n_rows]
    t0 = begin.min().item()
    out = {"last_row_end": ends.max().item() - t0, "row_us": (ends - begin).median().item()}
    if sketch and stamps[2 * n_rows + polls].item() != 0:  # a finisher ran (not PROBE 4096 / 8192)
        poll_in, fin_end = t[2 * n_rows:2 * n_rows + polls], t[2 * n_rows + polls].item()
        waits = [poll_in[k].item() - ends[k * poll:(k + 1) * poll].max().item() for k in range(polls)]
        out.update({"last_poll_in": poll_in[-1].item() - t0, "finisher_end": fin_end - t0,
                    "finisher_after_rows": fin_end - ends.max().item(), "poll_wait_median": statistics.median(waits),
                    "last_poll_wait": waits[-1]})
    return out


def main() -> None:
    watchdog()
    g = torch.Generator().manual_seed(2)
    inp, _ = OPS[OP].make(SHAPE, torch.bfloat16, DEV, g)
    y = torch.empty_like(inp["x"])
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device=DEV) if DEV == "cuda" else None
    lines = [f"# {OP} row launch timeline; {torch.cuda.get_device_name() if DEV == 'cuda' else DEV}, bf16 "
             f"{SHAPE[0]}x{SHAPE[1]}, {LAUNCHES} launches each, L2 flushed before each", "",
             f"Command: `BENCH_OP={OP} BENCH_SHAPE={SHAPE[0]}x{SHAPE[1]} BENCH_CONFIGS='{json.dumps(CONFIGS)}' "
             "python bench/finisher_timeline.py`",
             "", "µs from the first row's start, medians over the launches", "",
             "| launch | config | last row end | row program µs | last poll in | finisher end | finisher after "
             "last row | poll wait (median) | last poll wait |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for sketch in (False, True):
        for cfg in CONFIGS if sketch else [{}]:
            for _ in range(2):  # compile and warm
                _timeline(inp, y, sketch, cfg, flush)
            runs = [_timeline(inp, y, sketch, cfg, flush) for _ in range(LAUNCHES)]
            reset_state()
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            cells = [f"{med.get(k, float('nan')):.2f}" if k in med else "-" for k in
                     ("last_row_end", "row_us", "last_poll_in", "finisher_end", "finisher_after_rows",
                      "poll_wait_median", "last_poll_wait")]
            lines.append(f"| {'sketch' if sketch else 'plain'} | {config_name(cfg) if sketch else '-'} | "
                         + " | ".join(cells) + " |")
    write_report("\n".join(lines) + "\n", "finisher_timeline.md")


if __name__ == "__main__":
    main()
