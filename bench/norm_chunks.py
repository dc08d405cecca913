"""rmsnorm / layernorm: rows held whole in registers against rows read in chunks (issue #6: as fast
as torch.compile), timed side by side in interleaved rounds, with torch.compile in the same rounds.

    BENCH_ROUNDS=7 python bench/norm_chunks.py              # on a CUDA machine; writes $OUT/norm_chunks.md
    BENCH_OPS=rope python bench/norm_chunks.py               # rope's lane-accumulator chains only
    BENCH_AB=base BENCH_OPS=rmsnorm,softmax python bench/norm_chunks.py  # also time bench/.ab/optwin_base
    BENCH_OPS="softmax,softmax (hf mask)" python bench/norm_chunks.py   # any bench/gpu_kernels.py OPS entry
    BENCH_CONFIGS='{"layernorm": [{"num_warps": 8, "maxnreg": 128}]}' python bench/norm_chunks.py
    BENCH_METHOD=graph python bench/norm_chunks.py           # CUDA graph replays instead of do_bench
    BENCH_METHOD=flush_sleep python bench/norm_chunks.py     # do_bench's flush, host launch cost hidden
    BENCH_SHAPE=8192x8192 python bench/norm_chunks.py        # another timing shape (bf16)
    BENCH_DTYPE=float16 python bench/norm_chunks.py          # another dtype of the inputs
    BENCH_NEIGHBOURS=0 BENCH_CONFIGS=... python bench/norm_chunks.py  # the shipped launch and the configs only
    TRITON_INTERPRET=1 python bench/norm_chunks.py --smoke   # CPU dry run of the script, small shapes

Last runs: bench/results/norm_chunks_h200_s12.md (the chunk sweep), norm_chunks_h200_s13b.md (A/B against
stop 12), norm_chunks_h200_s13g.md (the shipped launches).

Every round times every entry once (triton.testing.do_bench, median of its repetitions, L2
flushed), so a slow spell of the machine hits all entries alike; the table gives the median, min and
max over the rounds and the ratio of medians against torch.compile of the production variant. Per
config also: y bit-identical with and without the sketch, the sketch against optwin.ingest.sketch,
and (chunk = the twin's TRITON_CHUNK, or rows held whole) the output against the twin's
deterministic emulation on the first rows, in output ulps.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/, for the modules below
sys.path.insert(2, str(Path(__file__).resolve().parent / ".ab"))  # frozen revisions (bench/ab_snapshot.py)

import torch
from _bench_common import (
    config_name,
    entry_ms,
    report_tail,
    watchdog,
    worst_diff,
    write_report,
)
from gpu_kernels import OPS, _sweep_launchers

from optwin.kernels.sketch_buffer import (
    leftover_state,
    new_buffer,
    read_sketch,
    reset_state,
)

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
SHAPE = (64, 700) if SMOKE else tuple(int(v) for v in os.environ.get("BENCH_SHAPE", "4096x16384").split("x"))
ROUNDS = 1 if SMOKE else int(os.environ.get("BENCH_ROUNDS", "7"))
DTYPE = getattr(torch, os.environ.get("BENCH_DTYPE", "bfloat16"))
METHOD = os.environ.get("BENCH_METHOD", "do_bench")  # or "graph" (CUDA graph replays), "flush_sleep"
TWIN_ROWS = 8 if SMOKE else 16


# chunk widths of the sweep (BENCH_CHUNKS=1024,2048,4096 was the first run's, with stages 1 and 2:
# bench/results/norm_chunks_h200_s12.md; the chunked kernels keep 1 stage since)
SWEEP_CHUNKS = tuple(int(c) for c in os.environ.get("BENCH_CHUNKS", "").split(",") if c)
# programs per SM of the persistent grid to try (BENCH_PER_SM=4,32: 32 gives one program per row at 4096 rows)
SWEEP_PER_SM = tuple(int(c) for c in os.environ.get("BENCH_PER_SM", "").split(",") if c)
# frozen revisions to time beside the live package, each as a config `pkg=optwin_<name>` of every op
# (python bench/ab_snapshot.py <name> --rev <rev> makes them; carry bench/.ab to the device)
AB = tuple(f"optwin_{n}" for n in os.environ.get("BENCH_AB", "").split(",") if n)
# more launch overrides per op, as JSON: BENCH_CONFIGS='{"rmsnorm": [{"num_warps": 8, "maxnreg": 128}]}'
EXTRA: dict[str, list[dict[str, Any]]] = json.loads(os.environ.get("BENCH_CONFIGS") or "{}")
# BENCH_NEIGHBOURS=0: the shipped launch and BENCH_CONFIGS only, without its warps x stages neighbours
NEIGHBOURS = os.environ.get("BENCH_NEIGHBOURS", "1") != "0"


def _norm_configs(small: bool) -> list[dict[str, Any]]:
    """The shipped launch (the row in registers) first, its warps x stages neighbours, then chunk x warps
    (BENCH_CHUNKS=4096 for the chunked kernels)."""
    if small:
        return [{}, {"chunk": 256, "num_warps": 4}]
    whole = [{}] + ([{"num_warps": 8, "stages": 1}, {"num_warps": 8, "stages": 2}, {"num_warps": 4, "stages": 1}]
                    if NEIGHBOURS else [])
    whole += [{"per_sm": k} for k in SWEEP_PER_SM]
    return whole + [{"chunk": c, "num_warps": w} for c in SWEEP_CHUNKS for w in (4, 8, 16) if c // (32 * w) >= 2]


CONFIGS: dict[str, Callable[[bool], list[dict[str, Any]]]] = {
    "rmsnorm": _norm_configs,
    "layernorm": _norm_configs,
    # rope's sketch cost read +6 % to +33 % between runs at the shipped KEEP 2 (issue #6, stop 11);
    # in interleaved rounds KEEP 1, 2, 4 read the same (bench/results/norm_chunks_h200_s12.md)
    "rope": lambda small: [{}, {"lane_acc": True, "num_warps": 8, "keep": 1}],
    "softmax": lambda small: [{}],
}
PRODUCTION = {"rmsnorm": "fp32-acc", "layernorm": "torch", "rope": "fp32-angles", "softmax": "torch"}


def _bench(fn: Callable[[], Any]) -> float:
    """ms of one entry in one round: do_bench's median (L2 flushed before each call), or with
    BENCH_METHOD=graph the mean of CUDA graph replays (no flush, no host cost; _bench_common.entry_ms)."""
    return entry_ms(fn, METHOD, SMOKE)


def _twin_ulps(op: str, inp: dict[str, torch.Tensor], params: dict[str, Any], y: torch.Tensor,
               row_scale: bool = False) -> str:
    """Largest |kernel - twin| over the first rows, in ulps of the output dtype at each element (or at
    the row's largest |y|: layernorm's w * (h - m) * r cancels against the bias near 0)."""
    from optwin import twin

    rows = {k: (v[:TWIN_ROWS].cpu() if k == "x" else v.cpu()) for k, v in inp.items()}
    if op == "rope":
        return "-"
    dt = str(inp["x"].dtype).removeprefix("torch.")
    emu = twin.run(op, "triton", dt, rows, params).emulated  # float64 of dtype values
    got = y[:TWIN_ROWS].cpu().double()
    mag = emu.abs().amax(-1, keepdim=True) if row_scale else torch.maximum(got.abs(), emu.abs())
    ulp = torch.finfo(inp["x"].dtype).eps * mag.clamp(min=torch.finfo(inp["x"].dtype).tiny)
    return f"{float(((got - emu).abs() / ulp).max()):.1f}"


def _against_live(y: torch.Tensor, live: torch.Tensor) -> str:
    """A frozen revision's y against the live package's, bit for bit; differences where both are at
    most the smallest normal float32 (2^-126: subnormal, flushed to zero, or a subnormal fp32 value
    rounded up to a bf16 2^-126) are counted apart, so a change of the subnormal handling (softmax's
    ex2.approx.ftz, stop 19) reads apart from a change of every value."""
    diff = y.view(torch.int16 if y.element_size() == 2 else torch.int32) != live.view(
        torch.int16 if live.element_size() == 2 else torch.int32)
    if not bool(diff.any()):
        return "y = live's"
    tiny = torch.finfo(torch.float32).tiny
    sub = (y.float().abs() <= tiny) & (live.float().abs() <= tiny)
    if bool((diff & ~sub).any()):
        return f"y NOT live's: {int((diff & ~sub).sum())} normal values differ"
    return f"y = live's but {int(diff.sum())} values <= 2^-126"


def _clear_left_state(left_by: dict[tuple[str, str], int], entry: tuple[str, str]) -> None:
    """After an entry's launches: row records or workspace slots they left set (a bench probe that skips
    the finisher's reads) are counted against the entry and reset. Left set, every later launch's finisher
    would take those stale words without waiting for its own rows (stop 36's contaminated run)."""
    words, _, slots, _ = leftover_state()
    if words or slots:
        left_by[entry] = left_by.get(entry, 0) + words + slots
        reset_state()


LONG = (6, 1000) if SMOKE else (64, 100000)


def _long_row_check(op: str, dt: torch.dtype) -> str:
    """y with and without the sketch, the sketch vs optwin.ingest, the output vs the twin (first rows)."""
    from optwin.ingest.sketch import sketch as ingest_sketch

    g = torch.Generator().manual_seed(3)
    inp, params = OPS[op].make(LONG, dt, DEV, g)
    y, y0 = torch.empty_like(inp["x"]), torch.empty_like(inp["x"])
    buf = new_buffer(op, DEV)
    cfg = {"chunk": 256} if SMOKE else {}  # the smoke run's rows fit in registers: force the chunked kernel
    try:
        f, f0 = _sweep_launchers(op, inp, params, y, y0, cfg)
        f(buf)
        f0(None)
    except Exception as e:  # noqa: BLE001 - report and go on
        return f"{type(e).__name__}: {str(e)[:90]} | | "
    same = torch.equal(y, y0)
    d = worst_diff(read_sketch(op, buf, inp["x"].shape, params), ingest_sketch(op, inp, params))
    return f"{'yes' if same else 'NO'} | {d} | {_twin_ulps(op, inp, params, y, row_scale=True)}"


def _constant_rows_check(shape: tuple[int, int], dt: torch.dtype) -> str:
    """layernorm with exactly constant rows (their |c| is const_absmax, not in the ratio) and a
    near-constant one among random rows: y with and without the sketch, the sketch vs optwin.ingest."""
    from optwin.ingest.sketch import sketch as ingest_sketch

    g = torch.Generator().manual_seed(4)
    inp, params = OPS["layernorm"].make(shape, dt, DEV, g)
    x = inp["x"]
    x[1] = 2.5
    x[-2] = -96.0
    x[3] = 0.1  # not exact in float32: the kernel's mean is a few ulps off, the row is still constant
    x[4] = 300.0
    x[4, 7] = 302.0  # near-constant: cancels, counts in the ratio
    y, y0 = torch.empty_like(x), torch.empty_like(x)
    buf = new_buffer("layernorm", DEV)
    f, f0 = _sweep_launchers("layernorm", inp, params, y, y0, {"chunk": 256} if SMOKE and shape[1] > 256 else {})
    f(buf)
    f0(None)
    got, want = read_sketch("layernorm", buf, x.shape, params), ingest_sketch("layernorm", inp, params)
    return (f"{'yes' if torch.equal(y, y0) else 'NO'} | {got['const_absmax']:g} / {want['const_absmax']:g} | "
            f"{got['max_mean_over_std']:.4g} / {want['max_mean_over_std']:.4g} | {worst_diff(got, want)}")


def main() -> str:
    t0 = time.monotonic()
    from optwin.twin.numerics import TRITON_CHUNK

    twin_chunk = {"rmsnorm": TRITON_CHUNK, "layernorm": TRITON_CHUNK}
    name = torch.cuda.get_device_name() if DEV == "cuda" else "CPU (TRITON_INTERPRET smoke run)"
    x0 = torch.randn(*SHAPE, device=DEV).to(DTYPE)
    yc = torch.empty_like(x0)
    lines = [(f"# rmsnorm / layernorm chunked rows, rope lane chains; {name}, {DTYPE} {SHAPE[0]}x{SHAPE[1]}, "
              f"{ROUNDS} interleaved rounds, timed by {METHOD}"), ""]
    sel = os.environ.get("BENCH_OPS", "rmsnorm,layernorm,rope").split(",")
    entries: list[tuple[str, str, Callable[[], Any]]] = [("copy", "y.copy_(x)", lambda: yc.copy_(x0))]
    checks: dict[tuple[str, str], str] = {}
    left_by: dict[tuple[str, str], int] = {}  # entries whose launches left records or workspace slots set
    for op in sel:  # an OPS entry: "softmax (hf mask)" is softmax's kernel on another input
        b = OPS[op]
        kop = b.op  # the kernel's op
        g = torch.Generator().manual_seed(2)
        inp, params = b.make(SHAPE, DTYPE, DEV, g)
        x2 = {k: (v.reshape(-1, v.shape[-1]) if k == "x" and kop != "rope" else v) for k, v in inp.items()}
        if not SMOKE:
            fn = torch.compile(b.eager, dynamic=False)
            fn(inp, params)
            entries.append((op, f"torch.compile ({PRODUCTION[kop]})", lambda fn=fn, inp=inp, params=params: fn(inp, params)))
        for cfg in CONFIGS[kop](SMOKE) + EXTRA.get(op, []) + [{"pkg": pkg} for pkg in AB]:
            cname = config_name(cfg)
            y, y0 = torch.empty_like(x2["x"]), torch.empty_like(x2["x"])
            buf = new_buffer(kop, DEV)
            try:
                f, f0 = _sweep_launchers(kop, x2, params, y, y0, cfg)
                f(buf)
                f0(None)
                same = torch.equal(y.view(torch.int16), y0.view(torch.int16))
                d = worst_diff(read_sketch(kop, buf, inp["x"].shape, params),
                               __import__("optwin.ingest.sketch", fromlist=["sketch"]).sketch(kop, inp, params))
                chunk = cfg.get("chunk")
                tw = _twin_ulps(kop, x2, params, y0, row_scale=kop == "layernorm") if chunk in (None, twin_chunk.get(kop)) else "-"
                if not cfg:
                    live_y = y0.clone()  # the live default's output: a frozen revision's must match it
                elif "pkg" in cfg:
                    tw += f" ({_against_live(y0, live_y)})"
                checks[(op, cname)] = f"{'yes' if same else 'NO'} | {d} | {tw}"
                _clear_left_state(left_by, (op, cname))  # before the next config's check reads the records
            except Exception as e:  # noqa: BLE001 - report and go on
                checks[(op, cname)] = f"{type(e).__name__}: {str(e)[:90]} | | "
                continue
            entries.append((op, cname, lambda f0=f0: f0(None)))
            entries.append((op, cname + " +sketch", lambda f=f, buf=buf: f(buf)))
    times: dict[tuple[str, str], list[float]] = {(o, c): [] for o, c, _ in entries}
    print(f"{len(entries)} entries, {ROUNDS} rounds; compiled in {time.monotonic() - t0:.0f} s", flush=True)
    for _ in range(ROUNDS):
        for o, c, fn in entries:
            try:
                times[(o, c)].append(_bench(fn))
            except Exception as e:  # noqa: BLE001 - e.g. a launch that cannot be graph-captured: nan, go on
                print(f"{o} {c}: {type(e).__name__}: {str(e)[:80]}", flush=True)
                times[(o, c)].append(float("nan"))
            _clear_left_state(left_by, (o, c))
    med = {k: statistics.median(v) for k, v in times.items()}
    copy = med[("copy", "y.copy_(x)")]
    lines += [f"copy: {copy * 1e3:.1f} µs (median of rounds)", "",
              "| op | config | µs median | min | max | % of copy | vs torch.compile | +sketch µs | sketch cost | "
              "y same w/o sketch | sketch vs ingest | vs twin (ulps; layernorm: of the row's max) |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for o, c, _ in entries:
        if o == "copy" or c.endswith(" +sketch"):
            continue
        v = times[(o, c)]
        comp = next((med[k] for k in med if k[0] == o and k[1].startswith("torch.compile")), float("nan"))
        sk = med.get((o, c + " +sketch"))
        cost = f"{100 * (sk / med[(o, c)] - 1):+.1f}%" if sk else ""
        lines.append(f"| {o} | {c} | {med[(o, c)] * 1e3:.1f} | {min(v) * 1e3:.1f} | {max(v) * 1e3:.1f} | "
                     f"{100 * copy / med[(o, c)]:.0f}% | {comp / med[(o, c)]:.3f}x | "
                     f"{(sk or float('nan')) * 1e3:.1f} | {cost} | {checks.get((o, c), '- | - | -')} |")
    lines += ["", f"Rows past the register limit (the chunked kernels, default launch): {LONG[0]}x{LONG[1]}", "",
              "| op | dtype | y same w/o sketch | sketch vs ingest | vs twin (ulps of the row's max) |", "|---|---|---|---|---|"]
    for op in ("rmsnorm", "layernorm"):
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            lines.append(f"| {op} | {str(dt).removeprefix('torch.')} | {_long_row_check(op, dt)} |")
    lines += ["", "layernorm with constant rows (2.5, -96, 0.1) and a near-constant row (kernel / ingest)", "",
              "| shape | dtype | y same w/o sketch | const_absmax | max_mean_over_std | sketch vs ingest |", "|---|---|---|---|---|---|"]
    for shape in ((64, 1000), (8, 3000)) if SMOKE else ((4096, 16384), (1823, 781), (64, 100000)):
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            lines.append(f"| {shape[0]}x{shape[1]} | {str(dt).removeprefix('torch.')} | {_constant_rows_check(shape, dt)} |")
    if left_by:
        lines += ["", "Entries whose launches left row records or workspace slots set (reset after each, so the entries "
                  "after them were timed clean; their own sketch is not):",
                  *(f"- {o} {c}: {n}" for (o, c), n in left_by.items())]
    failed = [f"- {o} {c}: {v}" for (o, c), v in checks.items() if "Error" in v or "Exception" in v]
    if failed:
        lines += ["", "Configs that failed:", *failed]
    return report_tail(lines, t0, "programs per SM:", lambda k: str(k[0]).startswith(("rmsnorm", "layernorm", "rope")))


if __name__ == "__main__":
    watchdog()
    write_report(main(), "norm_chunks.md")
