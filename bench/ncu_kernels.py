r"""Launch each kernel of issue #6 once inside a profiler range, for Nsight Compute: torch.compile of the
production variant, our kernel without the sketch, our kernel with it (bf16 4096x16384; rope 4096x128x128).
Timings say how much the sketch costs; the hardware counters say why (issue stalls, occupancy, DRAM
throughput), where differences of variants (bench/norm_chunks.py) can only locate it.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \
        --section Occupancy --section LaunchStats --csv --page details --log-file $OUT/ncu.csv \
        python bench/ncu_kernels.py
    ncu --clock-control none --profile-from-start off --csv --page raw --log-file $OUT/ncu_stalls.csv \
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' python bench/ncu_kernels.py
    python bench/ncu_kernels.py --summary ncu.csv      # anywhere: the table of the log, in markdown
    python bench/ncu_kernels.py --stalls ncu_stalls.csv   # the largest stall reasons per launch
    ncu ... --section SourceCounters --page source --print-source sass --log-file $OUT/ncu_source.csv ...
    python bench/ncu_kernels.py --sass ncu_source.csv 67108864   # executed SASS per element, by opcode
    python bench/ncu_kernels.py --time      # the same launches by do_bench and CUDA graph replay (no ncu)
    TRITON_INTERPRET=1 python bench/ncu_kernels.py --smoke   # CPU dry run of the launches

Everything is compiled, autotuned and run once before the range starts, so the range holds exactly
the launches listed (their order is printed: ncu names kernels, not our configs).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/

# the counters worth a column, by ncu's names in the details page (section, metric name)
COLUMNS = (
    "Duration", "DRAM Throughput", "Registers Per Thread", "Achieved Occupancy", "Theoretical Occupancy",
    "Warp Cycles Per Issued Instruction",
)


def _num(v: str) -> float:
    """An ncu CSV value as a float: ncu writes thousands separators ("1,980,000"); empty is 0."""
    return float(v.replace(",", "") or 0)


def summary(path: str) -> str:
    """The ncu details log (CSV) as one markdown row per launch and the COLUMNS that it holds."""
    rows: dict[str, dict[str, str]] = {}
    launch: dict[str, str] = {}
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu prints its own lines before the CSV
    for r in csv.DictReader(lines):
        key = r["ID"]
        launch[key] = f"{r['Kernel Name'][:40]} | {r['Block Size']} | {r['Grid Size']}"
        if r["Metric Name"] in COLUMNS:
            rows.setdefault(key, {})[r["Metric Name"]] = f"{r['Metric Value']} {r['Metric Unit']}".strip()
    out = ["| # | kernel | block | grid | " + " | ".join(COLUMNS) + " |", "|---|---|---|---|" + "---:|" * len(COLUMNS)]
    for key in sorted(rows, key=int):
        out.append(f"| {key} | {launch[key]} | " + " | ".join(rows[key].get(c, "-") for c in COLUMNS) + " |")
    return "\n".join(out)


def stalls(path: str, top: int = 6) -> str:
    """The raw-page log of stall metrics as one markdown row per launch: its `top` stall reasons in
    warps stalled per issued instruction (summed, they are the cycles between two issues of a warp)."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    reader = csv.reader(lines)
    head = next(reader)
    next(reader)  # units
    out = ["| # | kernel | stalls per issued instruction (largest first) |", "|---|---|---|"]
    for r in reader:
        rec = dict(zip(head, r))
        vals = {k.removeprefix("smsp__average_warps_issue_stalled_").removesuffix("_per_issue_active.ratio"): _num(v)
                for k, v in rec.items() if k.startswith("smsp__average_warps_issue_stalled_") and v}
        tot = sum(vals.values())
        best = sorted(vals.items(), key=lambda kv: -kv[1])[:top]
        out.append(f"| {rec['ID']} | {rec['Kernel Name'][:40]} | total {tot:.1f}: "
                   + ", ".join(f"{k} {v:.2f}" for k, v in best) + " |")
    return "\n".join(out)


def source_sections(path: str) -> list[tuple[str, list[dict[str, str]]]]:
    """The source-page log (SASS with counters) as (kernel name, its SASS lines as {column: value}), one
    per profiled launch."""
    sections: list[tuple[str, list[dict[str, str]]]] = []
    head: list[str] = []
    with open(path, newline="") as f:
        for r in csv.reader(ln for ln in f if ln.startswith('"')):
            if r[0] == "Kernel Name":
                sections.append((r[1], []))
            elif r[0] == "Address":
                head = r
            elif sections:
                sections[-1][1].append(dict(zip(head, r)))
    return sections


def sass(path: str, elements: int, top: int = 16) -> str:
    """The source-page log (SASS with counters) as one markdown row per kernel: warp instructions
    executed per element of the input (x 32 threads / `elements`) by opcode, and the opcodes where
    the stall samples fall (a stall is charged to the instruction that waits: the first user of a load
    collects the memory latency)."""
    out = ["| # | kernel | SASS per element | by opcode | stall samples by opcode |", "|---|---|---:|---|---|"]
    for i, (name, rows) in enumerate(source_sections(path)):
        ops: dict[str, float] = {}
        stall: dict[str, float] = {}
        for r in rows:
            words = r["Source"].split()
            op = (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]
            ops[op] = ops.get(op, 0.0) + _num(r["Instructions Executed"]) * 32 / elements
            stall[op] = stall.get(op, 0.0) + _num(r["Warp Stall Sampling (All Samples)"])
        n_samples = sum(stall.values()) or 1.0
        by_op = ", ".join(f"{k} {v:.2f}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:top])
        by_stall = ", ".join(f"{k} {100 * v / n_samples:.0f}%" for k, v in sorted(stall.items(), key=lambda kv: -kv[1])[:6])
        out.append(f"| {i} | {name} | {sum(ops.values()):.1f} | {by_op} | {by_stall} |")
    return "\n".join(out)


def timings(launches) -> str:
    """Markdown: each launch's µs by do_bench (median, L2 flushed before each call, as bench/norm_chunks.py)
    and by CUDA graph replay (_bench_common.graph_ms: no flush, no host cost), so the profiler's
    durations can be set against the benches' for the same launches."""
    import triton.testing
    from _bench_common import graph_ms

    out = ["| # | launch | do_bench µs | CUDA graph µs |", "|---|---|---:|---:|"]
    for i, (label, fn) in enumerate(launches):
        bench = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
        try:
            graphed = f"{graph_ms(fn) * 1e3:.1f}"
        except Exception as e:  # noqa: BLE001 - a launch that cannot be captured: say so, time the rest
            graphed = f"{type(e).__name__}"
        out.append(f"| {i} | {label} | {bench * 1e3:.1f} | {graphed} |")
    return "\n".join(out)


def main() -> None:
    import torch
    from gpu_kernels import OPS, _sweep_launchers

    from optwin.kernels.sketch_buffer import new_buffer

    smoke = "--smoke" in sys.argv
    dev = "cpu" if smoke else "cuda"
    shape = (8, 300) if smoke else (4096, 16384)
    if os.environ.get("BENCH_SHAPE"):  # BENCH_SHAPE=8192x8192 (rope: seq x heads x d, e.g. 16384x32x128)
        shape = tuple(int(v) for v in os.environ["BENCH_SHAPE"].split("x"))
    ops = os.environ.get("BENCH_OPS", "rmsnorm,layernorm,softmax,rope").split(",")
    # more launches per op, as bench/norm_chunks.py takes them: BENCH_CONFIGS='{"rmsnorm": [{"num_warps": 32}]}'
    extra = json.loads(os.environ.get("BENCH_CONFIGS") or "{}")
    # BENCH_DTYPES=bfloat16,float16: the same launches per dtype (fp16 layernorm's sketch costs more than bf16's)
    dtypes = [getattr(torch, d) for d in os.environ.get("BENCH_DTYPES", "bfloat16").split(",")]
    launches = []  # (label, fn)
    for op, dt in [(op, dt) for op in ops for dt in dtypes]:
        name = f"{op} {dt}" if len(dtypes) > 1 else op  # labels name the dtype where there are several
        g = torch.Generator().manual_seed(2)
        inp, params = OPS[op].make(shape, dt, dev, g)
        x2 = {k: (v.reshape(-1, v.shape[-1]) if k == "x" and op != "rope" else v) for k, v in inp.items()}
        y, y0 = torch.empty_like(x2["x"]), torch.empty_like(x2["x"])
        buf = new_buffer(op, dev)
        if not smoke:
            comp = torch.compile(OPS[op].eager, dynamic=False)
            launches.append((f"{name} torch.compile", lambda c=comp, i=inp, p=params: c(i, p)))
        for cfg in [{}] + extra.get(op, []):  # the shipped launch, then BENCH_CONFIGS' overrides
            f, f0 = _sweep_launchers(op, x2, params, y, y0, cfg)
            label = f"{name} ours" + (f" {cfg}" if cfg else "")
            launches.append((label, lambda f0=f0: f0(None)))
            launches.append((f"{label} +sketch", lambda f=f, b=buf: f(b)))
    for _, fn in launches:  # compile, autotune, allocate outside the range
        fn()
        fn()
    if "--time" in sys.argv:  # the same launches timed as the benches time them, no profiler
        print(timings(launches))
        return
    if not smoke:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    for i, (label, fn) in enumerate(launches):
        print(f"launch {i}: {label}", flush=True)
        fn()
    if not smoke:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    if "--summary" in sys.argv:
        print(summary(sys.argv[sys.argv.index("--summary") + 1]))
    elif "--sass" in sys.argv:
        at = sys.argv.index("--sass")
        print(sass(sys.argv[at + 1], int(sys.argv[at + 2])))
    elif "--stalls" in sys.argv:
        print(stalls(sys.argv[sys.argv.index("--stalls") + 1]))
    else:
        main()
