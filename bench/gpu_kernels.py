"""GPU check and benchmark of our Triton kernels (optwin.kernels) against float64 math, torch eager,
torch.compile and the copy bandwidth measured in the same run.

    python bench/gpu_kernels.py            # on a CUDA machine; writes $OUT/kernels.md when OUT is set
    BENCH_SWEEP_S=150 BENCH_DTYPES=bfloat16 python bench/gpu_kernels.py   # plus the launch sweep

Needs torch, triton and numpy only (the optwin modules it imports are pure Python + torch).

Correctness: every kernel writes into an output buffer poisoned with NaN first, over large and odd
shapes, so an element the kernel forgot stays NaN; outputs are compared with float64 math and with
the production torch variant, and the fused sketch with optwin.ingest.sketch.
Timing (triton.testing.do_bench, median, L2 flushed between runs; the kernel without and with the sketch
in BENCH_KERNEL_ROUNDS interleaved rounds, default 3, the median of each): bandwidth = bytes read + written
over time, against `y.copy_(x)` of the same tensor. Sketch cost: the kernel with SKETCH on vs off
(a constexpr: the off variant has no sketch code at all), the tiny reduce step, and the unfused
alternatives (a minimal torch sketch: absmax + non-finite count + sum of squares; optwin.ingest's
float64 sketch).
"""

from __future__ import annotations

import importlib
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/, for `_bench_common`

import torch
from _bench_common import (
    AHEAD_CYCLES,
    differing_features,
    events_ms,
    graph_ms,
    watchdog,
    within_budget,
    worst_diff,
    write_report,
)

from optwin.kernels import production as P
from optwin.kernels._common import MAX_BLOCK
from optwin.kernels.compare import mismatch_report
from optwin.kernels.sketch_buffer import new_buffer, read_sketch

Tensor = torch.Tensor
DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# (atol, rtol) against float64 math: output rounding plus a few fp32 ulps (approximate rsqrt/exp)
TOL = {"float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2), "float32": (2e-5, 2e-5)}


# ------------------------------------------------------------------------------ the ops


@dataclass
class OpBench:
    """One kernel: inputs, a launch into given buffers, float64 math, the eager production variant."""

    op: str
    variant: str  # production variant timed as "eager" and compiled
    make: Callable[[tuple[int, ...], torch.dtype, str, torch.Generator], tuple[dict[str, Tensor], dict[str, Any]]]
    launch: Callable[[dict[str, Tensor], dict[str, Any], Tensor, Tensor | None], None]  # writes y (and buf)
    ref64: Callable[[dict[str, Tensor], dict[str, Any]], Tensor]
    eager: Callable[[dict[str, Tensor], dict[str, Any]], Tensor]
    rows: Callable[[tuple[int, ...]], int]  # kernel rows (sketch buffer rows before the param row)
    label: str = ""  # row label in the report (default: op)
    # the launch with its finisher deferred (optwin.kernels.deferred), returning its pending buffer; None: the op
    # has no deferred form
    launch_deferred: Callable[[dict[str, Tensor], dict[str, Any], Tensor], Tensor | None] | None = None

    @property
    def name(self) -> str:
        return self.label or self.op


def _randn(shape, dtype, device, g, scale=2.0, shift=0.0) -> Tensor:
    return (shift + scale * torch.randn(*shape, generator=g, dtype=torch.float32)).to(dtype).to(device)


def _rms_make(shape, dtype, device, g):
    return {"x": _randn(shape, dtype, device, g), "weight": _randn(shape[-1:], dtype, device, g, 0.2, 1.0)}, {}


def _rms_launch(inp, params, y, buf):
    from optwin.kernels.rmsnorm import EPS, _rmsnorm_launch

    _rmsnorm_launch(inp["x"].reshape(-1, inp["x"].shape[-1]), inp["weight"], y.view(-1, y.shape[-1]), buf, EPS)


def _rms_ref(inp, params):
    x = inp["x"].double()
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * inp["weight"].double()


def _softmax_make(shape, dtype, device, g):
    # rows from flat to peaked (temperatures 1..100), so peaked_frac is neither 0 nor 1
    temp = torch.logspace(0, 2, math.prod(shape[:-1]) or 1).reshape(*shape[:-1], 1)
    x = (temp * torch.randn(*shape, generator=g)).to(dtype).to(device)
    x[..., 1] = -math.inf  # a masked column
    return {"x": x}, {}


def _softmax_make_unmasked(shape, dtype, device, g):
    # the same rows without the masked column: logits with no -inf (e.g. sampling over a vocabulary)
    inp, params = _softmax_make(shape, dtype, device, g)
    x = inp["x"]
    if x.shape[-1] > 2:
        x[..., 1] = x[..., 2]
    else:
        x[..., 1] = 0.0
    return inp, params


def _softmax_make_hf_mask(shape, dtype, device, g):
    # attention scores masked as HF's eager attention masks them: a causal band of finfo.min (finite;
    # its square overflows float32: softmax.HUGE's branch), row r keeping its first (r+1)/rows of columns
    inp, params = _softmax_make_unmasked(shape, dtype, device, g)
    x = inp["x"]
    rows, n = math.prod(x.shape[:-1]) or 1, x.shape[-1]
    keep = ((torch.arange(rows, device=x.device) + 1) * n + rows - 1) // rows  # (rows,) columns kept
    causal = torch.arange(n, device=x.device)[None, :] >= keep[:, None]  # (rows, n)
    inp["x"] = x.reshape(rows, n).masked_fill(causal, torch.finfo(x.dtype).min).reshape(x.shape)
    return inp, params


def _softmax_launch(inp, params, y, buf):
    from optwin.kernels.softmax import _softmax_launch

    _softmax_launch(inp["x"].reshape(-1, inp["x"].shape[-1]), y.view(-1, y.shape[-1]), buf)


def _softmax_deferred(inp, params, y):
    from optwin.kernels.softmax import _softmax_launch

    return _softmax_launch(inp["x"].reshape(-1, inp["x"].shape[-1]), y.view(-1, y.shape[-1]), None, defer=True)


def _ln_make(shape, dtype, device, g):
    return {
        "x": _randn(shape, dtype, device, g, 2.0, 0.5),
        "weight": _randn(shape[-1:], dtype, device, g, 0.2, 1.0),
        "bias": _randn(shape[-1:], dtype, device, g, 0.1),
    }, {}


def _ln_launch(inp, params, y, buf):
    from optwin.kernels.layernorm import EPS, _layernorm_launch

    x2 = inp["x"].reshape(-1, inp["x"].shape[-1])
    _layernorm_launch(x2, inp["weight"], inp["bias"], y.view(-1, y.shape[-1]), buf, EPS)


def _ln_deferred(inp, params, y):
    from optwin.kernels.layernorm import EPS, _layernorm_launch

    x2 = inp["x"].reshape(-1, inp["x"].shape[-1])
    return _layernorm_launch(x2, inp["weight"], inp["bias"], y.view(-1, y.shape[-1]), None, EPS, defer=True)


def _ln_ref(inp, params):
    x = inp["x"].double()
    m = x.mean(-1, keepdim=True)
    var = ((x - m) ** 2).mean(-1, keepdim=True)
    return (x - m) / torch.sqrt(var + 1e-5) * inp["weight"].double() + inp["bias"].double()


def _rope_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(rows, n) -> (seq, heads, d) with heads*d = n and d = 128 where n allows it."""
    if len(shape) == 3:
        return shape  # type: ignore[return-value]
    seq, n = shape
    d = 128 if n % 128 == 0 else 2 * max(n // 6, 1)
    return seq, max(n // d, 1), d


def _rope_make(shape, dtype, device, g):
    seq, heads, d = _rope_shape(shape)
    pos = torch.randint(0, 8192, (seq,), generator=g).to(device)
    return {"x": _randn((seq, heads, d), dtype, device, g, 1.0), "positions": pos}, {"base": 10000.0}


def _rope_launch(inp, params, y, buf):
    from optwin.kernels.rope import _inv_freq, _rope_launch

    x = inp["x"]
    _rope_launch(x.unsqueeze(0), y.unsqueeze(0), buf, positions=inp["positions"].unsqueeze(0),
                 inv=_inv_freq(x.shape[-1], float(params["base"]), x.device), base=float(params["base"]))


def _rope_ref(inp, params):
    x, pos = inp["x"].double(), inp["positions"].double()
    d = x.shape[-1]
    inv = 1.0 / params["base"] ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    ang = torch.cat([pos[:, None] * inv] * 2, -1)[:, None, :]  # (seq, 1, d)
    return x * ang.cos() + P.rotate_half(x) * ang.sin()


def _rows2(shape):
    return math.prod(shape[:-1])


OPS: dict[str, OpBench] = {
    "rmsnorm": OpBench("rmsnorm", "fp32-acc", _rms_make, _rms_launch, _rms_ref,
                       lambda i, p: P.rmsnorm_fp32_acc(i["x"], i["weight"], 1e-6), _rows2),
    "softmax": OpBench("softmax", "torch", _softmax_make, _softmax_launch,
                       lambda i, p: torch.softmax(i["x"].double(), -1), lambda i, p: P.softmax_torch(i["x"]), _rows2,
                       launch_deferred=_softmax_deferred),
    "layernorm": OpBench("layernorm", "torch", _ln_make, _ln_launch, _ln_ref,
                         lambda i, p: P.layernorm_torch(i["x"], i["weight"], i["bias"], 1e-5), _rows2,
                         launch_deferred=_ln_deferred),
    "rope": OpBench("rope", "fp32-angles", _rope_make, _rope_launch, _rope_ref,
                    lambda i, p: P.rope_fp32_angles(i["x"], i["positions"], p["base"]), lambda s: _rope_shape(s)[0]),
}
BASE_OPS = tuple(OPS)
# softmax on its timing input without the masked column (main() times it; run()'s default leaves it out)
OPS["softmax (no mask)"] = OpBench("softmax", "torch", _softmax_make_unmasked, _softmax_launch,
                                   lambda i, p: torch.softmax(i["x"].double(), -1), lambda i, p: P.softmax_torch(i["x"]),
                                   _rows2, label="softmax (no mask)", launch_deferred=_softmax_deferred)
OPS["softmax (hf mask)"] = OpBench("softmax", "torch", _softmax_make_hf_mask, _softmax_launch,
                                   lambda i, p: torch.softmax(i["x"].double(), -1), lambda i, p: P.softmax_torch(i["x"]),
                                   _rows2, label="softmax (hf mask)", launch_deferred=_softmax_deferred)


# ------------------------------------------------------------------------------ correctness


def _sketch_diff(op: str, inp: dict[str, Tensor], params: dict[str, Any], buf: Tensor) -> str:
    """Largest relative difference between the kernel's sketch and optwin.ingest's, with its key."""
    try:
        from optwin.ingest.sketch import sketch as ingest_sketch
    except Exception as e:  # noqa: BLE001 - the bench must still report the rest
        return f"ingest unavailable ({type(e).__name__})"
    got = read_sketch(op, buf, inp["x"].shape, params)
    want = ingest_sketch(op, inp, params)
    worst, key = 0.0, ""
    for k, w in want.items():
        d = abs(got[k] - w) / max(abs(w), 1e-30)
        if d > worst:
            worst, key = d, k
    return f"{worst:.1e}" + (f" ({key})" if key else "")


def check(op: str, shape: tuple[int, ...], dtype: str, device: str, seed: int = 0) -> dict[str, Any]:
    """Run the kernel into NaN-poisoned buffers; compare with float64 and the production variant."""
    b = OPS[op]
    g = torch.Generator().manual_seed(seed)
    inp, params = b.make(shape, DT[dtype], device, g)
    x = inp["x"]
    y = torch.full(x.shape, float("nan"), dtype=x.dtype, device=device)
    buf = new_buffer(b.op, device).fill_(float("nan"))
    b.launch(inp, params, y, buf)
    y0 = torch.full(x.shape, float("nan"), dtype=x.dtype, device=device)
    b.launch(inp, params, y0, None)  # sketch off: y must be bit-identical
    same_y = bool(torch.equal(y0.view(torch.uint8) if y0.dtype != torch.float32 else y0.view(torch.int32),
                              y.view(torch.uint8) if y.dtype != torch.float32 else y.view(torch.int32)))
    buf2 = new_buffer(b.op, device).fill_(float("nan"))
    b.launch(inp, params, torch.empty_like(y), buf2)  # the workspace must be reset by the first launch
    rerun = float(((buf2 - buf).abs() / buf.abs().clamp(min=1e-30)).nan_to_num(1.0).max())
    deferred_same = "n/a"
    if b.launch_deferred is not None:  # the deferred finisher: y and every feature bit for bit the in-launch one's
        from optwin.kernels import deferred

        y_d = torch.full(x.shape, float("nan"), dtype=x.dtype, device=device)
        buf_d = b.launch_deferred(inp, params, y_d)
        was = buf_d is not None and deferred.pending(buf_d)
        if buf_d is None or not torch.equal(y_d.view(torch.uint8), y.view(torch.uint8)):
            deferred_same = "NO (y)" if buf_d is not None else "NO (no buffer)"
        else:
            want, got = read_sketch(b.op, buf, x.shape, params), read_sketch(b.op, buf_d, x.shape, params)
            bad = differing_features(got, want)
            if not bad:
                deferred_same = "yes" if was else "yes (not deferred)"
            elif was:
                deferred_same = f"NO ({', '.join(bad)})"
            else:  # a launch that finished in itself (a persistent one): its atomics' order, as the 2nd launch's
                deferred_same = f"not deferred: {worst_diff({k: got[k] for k in bad}, {k: want[k] for k in bad})}"
    ref = b.ref64(inp, params)
    unwritten = int((torch.isnan(y) & ~torch.isnan(ref)).sum())
    atol, rtol = TOL[dtype]
    if op == "rope" and dtype == "float32":
        # fp32 angles (spec numerics): inv and pos*inv each round at |ang| <= 8192, ~2 * 8192 * 2^-24
        # = 1e-3 rad, times |x| up to ~5: the H200 run saw 2e-3 worst. The production fp32-angles
        # variant has the same error; the column "vs production" isolates the kernel (4.8e-7).
        atol = 5e-3
    rep64 = mismatch_report(y, ref, atol, rtol)
    prod = b.eager(inp, params)
    diff_prod = (y.double() - prod.double()).abs().nan_to_num(0.0).max().item()
    return {
        "op": b.name, "dtype": dtype, "shape": "x".join(map(str, x.shape)), "unwritten": unwritten,
        "vs_float64": rep64 or "ok", "max_abs_vs_production": diff_prod,
        "sketch_unwritten": int(torch.isnan(buf).sum()), "sketch_vs_ingest": _sketch_diff(b.op, inp, params, buf),
        "same_y": "yes" if same_y else "NO", "rerun": rerun, "deferred_same": deferred_same,
    }


# ------------------------------------------------------------------------------ timing


def _timer(device: str, mode: str = "median") -> Callable[[Callable[[], Any]], float]:
    """Milliseconds of fn: triton.testing.do_bench's median on CUDA, perf_counter elsewhere (tests). mode
    "ahead": ms a call of deferred.PAGE_CALLS calls back to back queued behind a GPU sleep, the median of 5 windows
    (the deferred launch: each window holds its page's one settle, and the host's time, whose stalls made
    do_bench's means of it swing by +3 to +56 % between runs, stays out)."""
    if device == "cuda" and mode == "ahead":
        from optwin.kernels import deferred

        return lambda fn: events_ms(fn, flush=False, sleep=AHEAD_CYCLES, calls=deferred.PAGE_CALLS, reps=5)
    if device == "cuda":
        import triton.testing

        return lambda fn: float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode=mode))

    def cpu(fn: Callable[[], Any]) -> float:
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)

    return cpu


def minimal_sketch(x: Tensor) -> Tensor:
    """The cheapest unfused torch sketch: absmax of finite values, non-finite count, sum of squares."""
    fin = torch.isfinite(x)
    xf = torch.where(fin, x, 0).float()
    return torch.stack([xf.abs().amax(), (~fin).sum().float(), (xf * xf).sum()])


KERNEL_ROUNDS = int(os.environ.get("BENCH_KERNEL_ROUNDS", "3"))  # interleaved rounds of the kernel timings


def time_op(op: str, shape: tuple[int, ...], dtype: str, device: str, copy_ms: float,
            compile_ok: bool) -> dict[str, Any]:
    """Timings (ms) and bandwidths for one op at one shape and dtype."""
    b = OPS[op]
    t = _timer(device)
    g = torch.Generator().manual_seed(1)
    inp, params = b.make(shape, DT[dtype], device, g)
    x = inp["x"]
    y = torch.empty_like(x)
    buf = new_buffer(b.op, device)
    nbytes = 2 * x.numel() * x.element_size()  # read x, write y (weights/positions are negligible)
    r: dict[str, Any] = {"op": b.name, "dtype": dtype, "shape": "x".join(map(str, x.shape))}
    # the kernel without and with the sketch in interleaved rounds, the median of each: a slow spell of
    # the machine (single do_bench timings spiked +40-75 % on one entry a run in stop 22's official
    # runs, bench/results/kernels_h200_s22*.md) then hits both and moves no median
    plain, sketched = [], []
    for _ in range(KERNEL_ROUNDS):
        plain.append(t(lambda: b.launch(inp, params, y, None)))
        sketched.append(t(lambda: b.launch(inp, params, y, buf)))
    r["kernel_ms"], r["kernel_sketch_ms"] = statistics.median(plain), statistics.median(sketched)
    r["kernel_ahead_ms"] = r["sketch_ahead_ms"] = r["deferred_ahead_ms"] = float("nan")
    if b.launch_deferred is not None:  # the deferred finisher beside the launch without the sketch and the in-launch one
        from optwin.kernels import deferred

        t_ahead = _timer(device, "ahead")
        ahead: dict[str, list[float]] = {"kernel": [], "sketch": [], "deferred": []}
        for _ in range(KERNEL_ROUNDS):
            ahead["kernel"].append(t_ahead(lambda: b.launch(inp, params, y, None)))
            ahead["sketch"].append(t_ahead(lambda: b.launch(inp, params, y, buf)))
            ahead["deferred"].append(t_ahead(lambda: b.launch_deferred(inp, params, y)))
        deferred.settle_all()
        for k, v in ahead.items():
            r[f"{k}_ahead_ms"] = statistics.median(v)
    r["eager_ms"] = t(lambda: b.eager(inp, params))
    r["minimal_sketch_ms"] = t(lambda: minimal_sketch(x))
    try:
        from optwin.ingest.sketch import sketch_tensor

        r["ingest_sketch_ms"] = t(lambda: sketch_tensor(b.op, inp, params))
    except Exception:  # noqa: BLE001
        r["ingest_sketch_ms"] = float("nan")
    r["compiled_ms"] = float("nan")
    if compile_ok:
        try:
            fn = torch.compile(b.eager, dynamic=False)
            fn(inp, params)  # compile outside the timing
            r["compiled_ms"] = t(lambda: fn(inp, params))
        except Exception as e:  # noqa: BLE001
            r["compiled_error"] = f"{type(e).__name__}: {str(e)[:80]}"
    # the same launches replayed from CUDA graphs (no L2 flush, no host cost): do_bench's flush moved some
    # ratios by several points on the H200 (bench/results/timings_h200_s15.md)
    graphed = {"kernel_graph_ms": lambda: b.launch(inp, params, y, None),
               "kernel_sketch_graph_ms": lambda: b.launch(inp, params, y, buf)}
    if not math.isnan(r["compiled_ms"]):
        graphed["compiled_graph_ms"] = lambda: fn(inp, params)
    for key, call in graphed.items():
        r[key] = float("nan")
        if device == "cuda":
            try:
                r[key] = graph_ms(call)
            except Exception as e:  # noqa: BLE001 - a launch that cannot be captured: n/a, time the rest
                r.setdefault("graph_error", f"{key}: {type(e).__name__}: {str(e)[:80]}")
    r.setdefault("compiled_graph_ms", float("nan"))
    r["gbps"] = nbytes / (r["kernel_ms"] * 1e-3) / 1e9
    r["copy_frac"] = copy_ms / r["kernel_ms"]  # same bytes: kernel bandwidth / copy bandwidth
    r["sketch_overhead"] = r["kernel_sketch_ms"] / r["kernel_ms"] - 1
    return r


def copy_bandwidth(shape: tuple[int, ...], dtype: str, device: str) -> tuple[float, float]:
    """(ms, GB/s) of y.copy_(x): read + write of the tensor."""
    x = torch.randn(*shape, device=device).to(DT[dtype])
    y = torch.empty_like(x)
    ms = _timer(device)(lambda: y.copy_(x))
    return ms, 2 * x.numel() * x.element_size() / (ms * 1e-3) / 1e9


# ------------------------------------------------------------------------------ report


def _fmt(v: Any, nd: int = 3) -> str:
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.{nd}g}"
    return str(v)


def _deferred_cells(r: dict[str, Any]) -> str:
    """The GPU-ahead cells: µs a call without the sketch / finisher in the launch / deferred (64 calls back to
    back behind a GPU sleep, the settle inside), and the deferred launch's cost."""
    plain, sk, dfd = (r.get(f"{k}_ahead_ms", float("nan")) for k in ("kernel", "sketch", "deferred"))
    if math.isnan(plain) or math.isnan(dfd):
        return "- | -"
    return f"{plain * 1e3:.1f} / {sk * 1e3:.1f} / {dfd * 1e3:.1f} | {100 * (dfd / plain - 1):+.1f}%"


def report(checks: list[dict[str, Any]], copies: dict[str, tuple[float, float]], times: list[dict[str, Any]],
           device_name: str, notes: list[str]) -> str:
    lines = [f"# optwin.kernels on {device_name}", ""]
    lines += ["## Correctness (NaN-poisoned outputs, float64 math, production variant, ingest sketch)", "",
              "| op | dtype | shape | unwritten | vs float64 | max abs vs production | sketch unwritten | sketch rel. diff vs ingest | y same w/o sketch | 2nd launch rel. diff | deferred = in the launch |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in checks:
        lines.append(f"| {c['op']} | {c['dtype']} | {c['shape']} | {c['unwritten']} | {c['vs_float64']} | "
                     f"{_fmt(c['max_abs_vs_production'])} | {c['sketch_unwritten']} | {c['sketch_vs_ingest']} | {c['same_y']} | {c['rerun']:.1e} | {c['deferred_same']} |")
    lines += ["", "## Copy bandwidth (y.copy_(x), same run)", "", "| dtype | ms | GB/s |", "|---|---|---|"]
    for dt, (ms, gbps) in copies.items():
        lines.append(f"| {dt} | {ms * 1e3:.1f} µs | {gbps:.0f} |")
    lines += ["", f"## Timing (median µs; kernel and kernel+sketch: median of {KERNEL_ROUNDS} interleaved rounds; bandwidth = read + write bytes / time; graph: CUDA graph replays)", "",
              ("| op | dtype | shape | kernel | GB/s | % of copy | eager | compiled | kernel+sketch | sketch cost "
               "| extra launches | unfused minimal sketch | ingest sketch (fp64) | graph: kernel | graph: compiled "
               "| graph: sketch cost | GPU ahead, 64 back to back: kernel / +sketch / deferred | deferred: sketch cost |"),
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    us = lambda v: _fmt(v * 1e3, 4)
    for r in times:
        g_cost = r["kernel_sketch_graph_ms"] / r["kernel_graph_ms"] - 1
        lines.append(
            f"| {r['op']} | {r['dtype']} | {r['shape']} | {us(r['kernel_ms'])} | {r['gbps']:.0f} | "
            f"{100 * r['copy_frac']:.0f}% | {us(r['eager_ms'])} | {us(r['compiled_ms'])} | {us(r['kernel_sketch_ms'])} | "
            f"{100 * r['sketch_overhead']:+.1f}% | 0 | {us(r['minimal_sketch_ms'])} | "
            f"{us(r['ingest_sketch_ms'])} | {us(r['kernel_graph_ms'])} | {us(r['compiled_graph_ms'])} | "
            f"{'n/a' if math.isnan(g_cost) else f'{100 * g_cost:+.1f}%'} | {_deferred_cells(r)} |")
        if "compiled_error" in r:
            notes.append(f"{r['op']}/{r['dtype']} torch.compile failed: {r['compiled_error']}")
        if "graph_error" in r:
            notes.append(f"{r['op']}/{r['dtype']} CUDA graph: {r['graph_error']}")
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


# Launch configurations the sweep times (bf16, the timing shape), as keyword overrides of each
# op's launch function; the first of each op is the current default.
SWEEP: dict[str, list[dict[str, Any]]] = {
    "rmsnorm": [{}, {"num_warps": 16}, {"num_warps": 4}, {"stages": 2}, {"num_warps": 16, "stages": 2},
                {"stages": 3}, {"per_sm": 32}, {"num_warps": 4, "stages": 2}],
    "layernorm": [{}, {"num_warps": 8}, {"num_warps": 8, "stages": 2}, {"num_warps": 16, "stages": 2},
                  {"num_warps": 4, "stages": 1}],
    "softmax": [{}, {"num_warps": 8}, {"stages": 2}, {"num_warps": 32}, {"num_warps": 4}, {"per_sm": 32}],
    "rope": [{}, {"num_warps": 8}, {"block_h": 64, "num_warps": 8}, {"block_h": 32, "num_warps": 8},
             {"block_h": 32, "num_warps": 4}, {"block_h": 16, "num_warps": 4}, {"block_h": 8, "num_warps": 4},
             {"block_h": 32, "num_warps": 4, "stages": 2}, {"block_h": 16, "num_warps": 4, "stages": 2},
             {"per_sm": 64}, {"block_h": 32, "num_warps": 4, "per_sm": 64}, {"block_h": 16, "num_warps": 4, "per_sm": 64}],
}


def _sweep_launcher(op: str, inp: dict[str, Tensor], params: dict[str, Any], y: Tensor, cfg: dict[str, Any]):
    """fn(buf) launching op with the overrides in cfg; cfg's `pkg` names the package whose kernels to
    launch (a frozen revision from bench/ab_snapshot.py, e.g. "optwin_base"; default the live one)."""
    cfg = dict(cfg)
    mod = importlib.import_module(f"{cfg.pop('pkg', 'optwin')}.kernels.{op}")
    if op == "rmsnorm":
        return lambda bb: mod._rmsnorm_launch(inp["x"], inp["weight"], y, bb, mod.EPS, **cfg)
    if op == "layernorm":  # cfg "defer": the deferred launch, its buffer the page's (bb only says sketch or not)
        if cfg.pop("defer", False):
            return lambda bb: mod._layernorm_launch(inp["x"], inp["weight"], inp["bias"], y, None, mod.EPS,
                                                    defer=bb is not None, **cfg)
        return lambda bb: mod._layernorm_launch(inp["x"], inp["weight"], inp["bias"], y, bb, mod.EPS, **cfg)
    if op == "softmax":
        return lambda bb: mod._softmax_launch(inp["x"], y, bb, **cfg)
    x = inp["x"]
    inv = mod._inv_freq(x.shape[-1], float(params["base"]), x.device)
    return lambda bb: mod._rope_launch(x.unsqueeze(0), y.unsqueeze(0), bb, positions=inp["positions"].unsqueeze(0),
                                       inv=inv, base=float(params["base"]), **cfg)


def _sweep_launchers(op: str, inp: dict[str, Tensor], params: dict[str, Any], y: Tensor, y0: Tensor,
                     cfg: dict[str, Any]):
    """(fn(buf) writing y, fn(buf) writing y0) for op with the overrides in cfg: the sketch run and
    the run without it, for the bit-identity check."""
    return _sweep_launcher(op, inp, params, y, cfg), _sweep_launcher(op, inp, params, y0, cfg)


def sweep(shape, device: str, t0: float, budget_s: float, copy_ms: float) -> list[str]:
    """Markdown rows: each SWEEP config of each op (bf16) timed with and without the sketch, and
    whether y is bit-identical between the two (the timing shape)."""
    out = ["| op | config | kernel µs | % of copy | kernel+sketch µs | sketch cost | y same |", "|---|---|---:|---:|---:|---:|---|"]
    t = _timer(device)
    for op, cfgs in SWEEP.items():
        g = torch.Generator().manual_seed(2)
        inp, params = OPS[op].make(shape, torch.bfloat16, device, g)
        y = torch.empty_like(inp["x"])
        y0 = torch.empty_like(y)
        buf = new_buffer(op, device)
        for name, cfg in within_budget(cfgs, t0, budget_s, out, op, 4):
            try:
                f, f0 = _sweep_launchers(op, inp, params, y, y0, cfg)
                a, b2 = t(lambda: f0(None)), t(lambda: f(buf))  # noqa: B023 - called at once
                same = torch.equal(y.view(torch.int16), y0.view(torch.int16))
                out.append(f"| {op} | {name} | {a * 1e3:.1f} | {100 * copy_ms / a:.0f}% | {b2 * 1e3:.1f} | "
                           f"{100 * (b2 / a - 1):+.1f}% | {'yes' if same else 'NO'} |")
            except Exception as e:  # noqa: BLE001
                out.append(f"| {op} | {name} | {type(e).__name__}: {str(e)[:60]} | | | | |")
    return out


# the last: a Llama 3 vocabulary's logits, rows past MAX_BLOCK (softmax_long, the chunked norms)
CHECK_SHAPES = [(4096, 16384), (1823, 781), (3, 65536), (7, 1025), (5, 128256)]
TIME_SHAPE = (4096, 16384)


def run(device: str = "cuda", check_shapes=CHECK_SHAPES, time_shape=TIME_SHAPE, dtypes=("bfloat16", "float16"),
        check_dtypes=("bfloat16", "float16", "float32"), compile_ok: bool = True, budget_s: float = 300.0,
        ops=BASE_OPS, sweep_s: float = 0.0) -> str:
    """Check, time, and return the markdown report; sections past the time budget are skipped.
    sweep_s > 0 first spends up to that many seconds on the SWEEP table (its own section)."""
    t0 = time.monotonic()
    notes: list[str] = []
    checks: list[dict[str, Any]] = []

    def run_checks(shapes, until: float) -> None:
        for shape in shapes:
            for op in ops:
                if op == "rope" and len(shape) == 2 and shape[1] > MAX_BLOCK:
                    continue  # a vocabulary-wide row is no rope shape (heads*d past the kernel's limit)
                for dt in check_dtypes:
                    if time.monotonic() - t0 > until:
                        notes.append(f"check {op}/{dt}/{shape} skipped: time budget spent")
                        continue
                    try:
                        checks.append(check(op, shape, dt, device))
                    except Exception as e:  # noqa: BLE001 - report and go on
                        notes.append(f"check {op}/{dt}/{shape} raised {type(e).__name__}: {str(e)[:120]}")

    # Order (the 2026-11-29 and session-11 runs spent their whole budget on checks, kernel compiles
    # included, and skipped every timing): copy bandwidth, then the first dtype's timings (each op's
    # kernels compile here; torch.compile while >= 45 s are left), then the large-shape checks (their
    # kernels mostly compiled by now) until 80% of the budget, the other dtypes' timings, the odd shapes.
    copies = {dt: copy_bandwidth(time_shape, dt, device) for dt in dict.fromkeys(("bfloat16",) + tuple(dtypes))}
    sweep_rows = sweep(time_shape, device, time.monotonic(), sweep_s, copies["bfloat16"][0]) if sweep_s > 0 else []
    t0 = time.monotonic()  # the sweep has its own budget
    times = []

    def run_times(dts, reserve: float) -> None:
        for dt in dts:
            for op in ops:
                left = budget_s - (time.monotonic() - t0)
                if left < reserve:
                    notes.append(f"timing {op}/{dt} skipped: time budget spent")
                    continue
                try:
                    times.append(time_op(op, time_shape, dt, device, copies[dt][0], compile_ok and left > 45))
                except Exception as e:  # noqa: BLE001
                    notes.append(f"timing {op}/{dt} raised {type(e).__name__}: {str(e)[:120]}")

    run_times(dtypes[:1], 5)
    run_checks(check_shapes[:1], 0.8 * budget_s)
    run_times(dtypes[1:], 10)
    run_checks(check_shapes[1:], budget_s)
    try:
        from optwin.kernels._common import occupancy_table

        for k, v in sorted(occupancy_table().items(), key=str):
            notes.append(f"programs per SM {k}: {v}")
    except Exception as e:  # noqa: BLE001
        notes.append(f"occupancy table unavailable: {e}")
    name = torch.cuda.get_device_name() if device == "cuda" else device
    notes.append(f"torch {torch.__version__}; wall {time.monotonic() - t0:.0f} s")
    md = report(checks, copies, times, name, notes)
    if sweep_rows:
        md += "\n## Launch sweep (bfloat16, timing shape; µs median)\n\n" + "\n".join(sweep_rows) + "\n"
    return md


def main() -> int:
    dtypes = tuple(os.environ.get("BENCH_DTYPES", "bfloat16,float16").split(","))
    md = run("cuda", budget_s=float(os.environ.get("BENCH_BUDGET_S", "300")), dtypes=dtypes,
             sweep_s=float(os.environ.get("BENCH_SWEEP_S", "0")), ops=tuple(OPS))
    write_report(md, "kernels.md")
    return 0


if __name__ == "__main__":
    watchdog()
    raise SystemExit(main())
