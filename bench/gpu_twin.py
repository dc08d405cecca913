"""python bench/gpu_twin.py [--cases 300] [--device cuda] [--triton] [--ops rope,layernorm] [--smoke]

Validate the float64 CPU twins against the real GPU. For every catalog triple (op, variant, dtype)
draw `--cases` seeded random inputs from varied families (normal, heavy-tailed student-t, outlier
channels, -inf masks incl. fully masked rows, long rope positions up to 2^20, near-identical geodesic
points, magnitudes spanning each fault boundary), run the production variant on the device
(optwin.kernels.production.run_variant), label the device's faults with the spec's predicates
(optwin.twin.faults.fault_flags against the twin's float64 reference of the same inputs), and run
the twin: deterministic emulation (noise none) and R noisy replays for each of stochastic, mca and
order. Per triple it reports:
- flag agreement: fraction of cases where the deterministic twin's fault flags equal the device's
  (every fault type);
- ulps median / p99: |emulated - device| in ulps of the output dtype over elements finite in both;
- coverage: fraction of cases whose device outcome (its fault-flag set) is among the twin's outcomes
  (the deterministic one or any noisy replay).
The markdown table is printed last; with $OUT set it is also written to $OUT/twin_gpu.md and the full
results (incl. example disagreements) to $OUT/twin_gpu.json.

Needs only torch, numpy and optwin. The device runs the production variants in the main process;
the twins run in a pool of CPU worker processes (spawned, one torch thread each). `--device cpu`
lets the CPU stand in for the GPU to test the script itself.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from optwin.catalog import CATALOG, all_triples, resolve_params  # noqa: E402
from optwin.kernels.production import run_variant  # noqa: E402
from optwin.twin import references, to_float64, twin_module  # noqa: E402
from optwin.twin.faults import fault_flags, relative_error  # noqa: E402
from optwin.twin.numerics import FORMATS, Numerics, ulps_between  # noqa: E402
from optwin.validation import validate  # noqa: E402

# Jobs carry tensors to the worker pool: share them through files, not one descriptor each
# (the default strategy runs out of descriptors with thousands of cases).
torch.multiprocessing.set_sharing_strategy("file_system")

TORCH_DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
NOISES = ("stochastic", "mca", "order")
ULP_SAMPLE = 2048  # elements per case kept for the ulp statistics

Inputs = dict[str, torch.Tensor]


# ------------------------------------------------------------------------------ input families


def _logu(g: torch.Generator, lo: float, hi: float) -> float:
    """2^U(lo, hi): a magnitude drawn log-uniformly."""
    return float(2.0 ** (lo + (hi - lo) * torch.rand((), generator=g, dtype=torch.float64).item()))


def _pick(g: torch.Generator, options: list | tuple) -> Any:
    return options[int(torch.randint(len(options), (), generator=g))]


def _noise(g: torch.Generator, shape: tuple[int, ...], family: str) -> torch.Tensor:
    """Unit-scale float64 noise of one family: normal, student-t (heavy tails) or outlier channels."""
    z = torch.randn(shape, generator=g, dtype=torch.float64)
    if family == "student_t":
        df = _pick(g, (1, 2, 3, 5))  # integer degrees of freedom: chi2 as a sum of squared normals from g
        chi2 = torch.randn(shape + (df,), generator=g, dtype=torch.float64).pow(2).sum(-1)
        z = z / torch.sqrt(chi2 / df).clamp_min(1e-6)
        z = z / z.abs().max().clamp_min(1e-300) * 4.0  # heavy-tailed shape, comparable absmax
    elif family == "outliers":
        ch = torch.rand(shape[-1], generator=g) < 0.05
        ch[int(torch.randint(shape[-1], (), generator=g))] = True
        z = z * torch.where(ch, _logu(g, 3, 8), 1.0).to(torch.float64)  # a few channels 8x-256x larger
    return z


def _to(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """Clamp into the finite range of dtype, then cast (an input must be finite)."""
    m = FORMATS[dtype].max
    return x.clamp(-m, m).to(TORCH_DT[dtype])


# Largest power-of-two scale exponent worth drawing per dtype: float16 overflows near 2^16, bfloat16
# and float32 near 2^128 (products overflow past 2^64).
SCALE_HI = {"float16": 15.0, "bfloat16": 70.0, "float32": 70.0}


def gen_rmsnorm(g: torch.Generator, dtype: str, family: str) -> tuple[Inputs, dict]:
    rows, hidden = _pick(g, (1, 3, 8)), _pick(g, (16, 64, 96, 256))
    hi = 10.0 if dtype == "float16" else SCALE_HI[dtype]  # float16 native-dtype faults at |x| ~ 256
    x = _noise(g, (rows, hidden), family) * _logu(g, -12, hi)
    w = 1 + 0.1 * torch.randn(hidden, generator=g, dtype=torch.float64)
    return {"x": _to(x, dtype), "weight": _to(w, dtype)}, {}


def gen_softmax(g: torch.Generator, dtype: str, family: str) -> tuple[Inputs, dict]:
    rows, n = _pick(g, (1, 4, 8)), _pick(g, (8, 33, 128, 256))
    base = "normal" if family == "masked" else family
    x = _noise(g, (rows, n), base) * _logu(g, -3, 8)  # naive exp overflows past 11 (f16) / 88 (f32)
    x = x + _pick(g, (0.0, 0.0, _logu(g, 0, 7)))  # a shared offset: torch's max subtraction absorbs it
    x = _to(x, dtype)
    if family == "masked":
        mask = torch.rand(rows, n, generator=g) < _pick(g, (0.1, 0.5, 0.9))
        if torch.rand((), generator=g) < 0.3:
            mask[int(torch.randint(rows, (), generator=g))] = True  # a fully masked row: NaN by physics
        x = x.masked_fill(mask, -math.inf)
    return {"x": x}, {}


def gen_rope(g: torch.Generator, dtype: str, family: str) -> tuple[Inputs, dict]:
    seq, d = _pick(g, (4, 16)), _pick(g, (16, 32, 64))
    x = _noise(g, (seq, 2, d), "normal" if family == "long_positions" else family) * _logu(g, -3, 6)
    if family == "long_positions" or torch.rand((), generator=g) < 0.3:
        start = int(_logu(g, 0, 20))  # a window of consecutive positions up to 2^20
        pos = torch.arange(start, start + seq)
    else:
        pos = torch.randint(0, int(_logu(g, 2, 13)), (seq,), generator=g)
    return {"x": _to(x, dtype), "positions": pos.to(torch.int64)}, {"base": _pick(g, (10000.0, 10000.0, 500000.0))}


def gen_attention(g: torch.Generator, dtype: str, family: str) -> tuple[Inputs, dict]:
    b, sq, sk, d = _pick(g, (1, 2)), _pick(g, (4, 16, 32)), _pick(g, (4, 16, 32)), _pick(g, (16, 32, 64))
    causal = bool(torch.rand((), generator=g) < 0.4) and sq == sk
    s_qk = _logu(g, -2, 6 if dtype == "float16" else 40)  # scores cross float16's 65504 and peak
    q = _noise(g, (b, 2, sq, d), family) * s_qk
    k = _noise(g, (b, 2, sk, d), family) * s_qk
    v = _noise(g, (b, 2, sk, d), family) * _logu(g, -2, 4)
    return {"q": _to(q, dtype), "k": _to(k, dtype), "v": _to(v, dtype)}, {"causal": causal}


def gen_layernorm(g: torch.Generator, dtype: str, family: str) -> tuple[Inputs, dict]:
    rows, hidden = _pick(g, (1, 4, 8)), _pick(g, (16, 64, 128, 256))
    std = _logu(g, -6, 6)
    ratio = _logu(g, -4, 16)  # |mean| / std around one-pass's cancellation at ~2^12
    sign = _pick(g, (-1.0, 1.0))
    x = sign * ratio * std + std * _noise(g, (rows, hidden), family)
    w = 1 + 0.1 * torch.randn(hidden, generator=g, dtype=torch.float64)
    bias = 0.1 * torch.randn(hidden, generator=g, dtype=torch.float64)
    return {"x": _to(x, dtype), "weight": _to(w, dtype), "bias": _to(bias, dtype)}, {}


def gen_geodesic(g: torch.Generator, dtype: str, family: str) -> tuple[Inputs, dict]:
    n = _pick(g, (16, 64, 256))
    u = lambda: torch.rand(n, generator=g, dtype=torch.float64)  # noqa: E731
    span = _pick(g, (0.01, 1.0, 90.0)) if family == "near_identical" else 90.0
    lat1, lon1 = (2 * u() - 1) * min(span, 89.0), (2 * u() - 1) * min(2 * span, 180.0)
    if family == "near_identical":
        sep = 10 ** (-6 + 6 * u())  # 1e-6 .. 1 degree, per pair
        if torch.rand((), generator=g) < 0.2:
            sep = sep * 0  # identical points: c may round past 1
    else:
        sep = _logu(g, -4, 7.5) * torch.ones(n, dtype=torch.float64)
    th = 2 * math.pi * u()
    lat2 = (lat1 + sep * torch.sin(th)).clamp(-90, 90)
    lon2 = lon1 + sep * torch.cos(th)
    return {k: v.float() for k, v in (("lat1", lat1), ("lon1", lon1), ("lat2", lat2), ("lon2", lon2))}, {}


def gen_matmul(g: torch.Generator, dtype: str, family: str) -> tuple[Inputs, dict]:
    m, k, n = _pick(g, (4, 16, 32)), _pick(g, (16, 64, 256, 1024)), _pick(g, (4, 16, 32))
    hi = 8.0 if dtype == "float16" else 66.0  # |a b| crosses 65504 (float16) / 3.4e38 (float32)
    a = _noise(g, (m, k), family) * _logu(g, -6, hi)
    b = _noise(g, (k, n), "normal") * _logu(g, -6, hi)
    return {"a": _to(a, dtype), "b": _to(b, dtype)}, {}


GENERATORS: dict[str, tuple[Callable[[torch.Generator, str, str], tuple[Inputs, dict]], tuple[str, ...]]] = {
    "rmsnorm": (gen_rmsnorm, ("normal", "student_t", "outliers")),
    "softmax": (gen_softmax, ("normal", "student_t", "outliers", "masked")),
    "rope": (gen_rope, ("normal", "student_t", "outliers", "long_positions")),
    "attention": (gen_attention, ("normal", "student_t", "outliers")),
    "layernorm": (gen_layernorm, ("normal", "student_t", "outliers")),
    "geodesic": (gen_geodesic, ("uniform", "near_identical")),
    "matmul": (gen_matmul, ("normal", "student_t", "outliers")),
}


def draw_case(op: str, dtype: str, seed: int) -> tuple[str, Inputs, dict]:
    """One seeded case: (family, inputs in dtype on the CPU, params)."""
    g = torch.Generator().manual_seed(seed)
    gen, fams = GENERATORS[op]
    family = fams[seed % len(fams)]
    inputs, params = gen(g, dtype, family)
    return family, inputs, params


# ------------------------------------------------------------------------------ the twin side


@dataclass
class CaseResult:
    family: str
    gpu_flags: tuple[bool, ...]
    twin_flags: tuple[bool, ...]
    covered: bool
    covered_by: dict[str, bool]
    ulps: np.ndarray
    gpu_rel: float
    twin_rel: float
    error: str = ""


@dataclass
class Job:
    op: str
    variant: str
    dtype: str
    cases: list[tuple[int, str, Inputs, dict, torch.Tensor | None, str]]  # (seed, family, inputs, params, y_dev, err)
    replays: int


def _flags(op: str, dtype: str, y: torch.Tensor, exact: torch.Tensor, r_prob: torch.Tensor | None) -> dict[str, torch.Tensor]:
    return fault_flags(op, dtype, y, exact, r_prob)


def evaluate(job: Job) -> list[tuple[int, CaseResult]]:
    """Run the twin on each case of one job and compare with the device output."""
    torch.set_num_threads(1)
    mod = twin_module(job.op)
    out_dtype = CATALOG[job.op].out_dtype(job.dtype)
    types = CATALOG[job.op].fault_types
    results = []
    for seed, family, inputs, params, y_dev, err in job.cases:
        if y_dev is None:
            results.append((seed, CaseResult(family, (), (), False, {}, np.zeros(0), math.nan, math.nan, err)))
            continue
        p = resolve_params(job.op, params)
        x = to_float64(inputs)
        exact, r_prob = references(job.op, x, p)
        emulated = mod.twin(Numerics("none"), job.variant, job.dtype, x, p)
        gpu = y_dev.double()
        gpu_f = _flags(job.op, job.dtype, gpu, exact, r_prob)
        twin_f = _flags(job.op, job.dtype, emulated, exact, r_prob)
        gpu_t = tuple(bool(gpu_f[t]) for t in types)
        twin_t = tuple(bool(twin_f[t]) for t in types)
        covered_by = {"none": gpu_t == twin_t}
        for noise in NOISES:
            num = Numerics(noise, job.replays, seed)
            outs = mod.twin(num, job.variant, job.dtype, {k: num.expand(v) for k, v in x.items()}, p)
            rf = _flags(job.op, job.dtype, outs, exact, r_prob)
            outcomes = {tuple(bool(rf[t][i]) for t in types) for i in range(job.replays)}
            covered_by[noise] = gpu_t in outcomes
        both = torch.isfinite(gpu) & torch.isfinite(emulated)
        u = ulps_between(emulated[both], gpu[both], out_dtype).numpy()
        if u.size > ULP_SAMPLE:
            u = np.random.default_rng(seed).choice(u, ULP_SAMPLE, replace=False)
        results.append((seed, CaseResult(family, gpu_t, twin_t, any(covered_by.values()), covered_by, u,
                                         float(relative_error(gpu, exact)), float(relative_error(emulated, exact)))))
    return results


# ------------------------------------------------------------------------------ the device side


def run_device(op: str, variant: str, dtype: str, inputs: Inputs, params: dict, device: str) -> torch.Tensor:
    """The production variant on the device; the output back on the CPU in its dtype."""
    y = run_variant(op, variant, dtype, {k: v.to(device) for k, v in inputs.items()}, params)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return y.cpu()


def device_jobs(triple: tuple[str, str, str], n_cases: int, seed0: int, device: str, replays: int,
                chunk: int) -> list[Job]:
    op, variant, dtype = triple
    cases = []
    for i in range(n_cases):
        seed = seed0 + i
        family, inputs, params = draw_case(op, dtype, seed)
        validate(op, variant, dtype, inputs)  # a generator bug must not pass as a fault
        try:
            y, err = run_device(op, variant, dtype, inputs, params, device), ""
        except Exception as e:  # noqa: BLE001 - a variant that fails on the device is reported, not fatal
            y, err = None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        cases.append((seed, family, inputs, params, y, err))
    return [Job(op, variant, dtype, cases[i:i + chunk], replays) for i in range(0, len(cases), chunk)]


# ------------------------------------------------------------------------------ report


def summarize(triple: tuple[str, str, str], results: list[CaseResult], seconds: float) -> dict[str, Any]:
    op, variant, dtype = triple
    ok = [r for r in results if not r.error]
    errors = sorted({r.error for r in results if r.error})
    row: dict[str, Any] = {"op": op, "variant": variant, "dtype": dtype, "cases": len(results),
                           "device_errors": len(results) - len(ok), "errors": errors[:3], "seconds": round(seconds, 2)}
    if not ok:
        return row
    types = CATALOG[op].fault_types
    ulps = np.concatenate([r.ulps for r in ok]) if any(r.ulps.size for r in ok) else np.zeros(0)
    agree = [r.gpu_flags == r.twin_flags for r in ok]
    row.update({
        "gpu_fault_rate": float(np.mean([any(r.gpu_flags) for r in ok])),
        "twin_fault_rate": float(np.mean([any(r.twin_flags) for r in ok])),
        "flag_agreement": float(np.mean(agree)),
        "agreement_by_type": {t: float(np.mean([r.gpu_flags[i] == r.twin_flags[i] for r in ok]))
                              for i, t in enumerate(types)},
        "gpu_rate_by_type": {t: float(np.mean([r.gpu_flags[i] for r in ok])) for i, t in enumerate(types)},
        "ulps_median": float(np.median(ulps)) if ulps.size else math.nan,
        "ulps_p99": float(np.quantile(ulps, 0.99)) if ulps.size else math.nan,
        "coverage": float(np.mean([r.covered for r in ok])),
        "coverage_by_noise": {n: float(np.mean([r.covered_by[n] for r in ok])) for n in ("none",) + NOISES},
        "families": sorted({r.family for r in ok}),
        "disagreements": [
            {"family": r.family, "gpu": dict(zip(types, r.gpu_flags)), "twin": dict(zip(types, r.twin_flags)),
             "gpu_rel_error": r.gpu_rel, "twin_rel_error": r.twin_rel, "covered": r.covered}
            for r, a in zip(ok, agree) if not a][:5],
    })
    return row


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    head = (f"Twin vs {meta['device_name']} ({meta['cases']} cases per triple, R={meta['replays']} replays per "
            f"noise mode, torch {meta['torch']}, {meta['seconds']:.0f} s)\n\n")
    lines = ["| op | variant | dtype | cases | device fault rate | twin fault rate | flag agreement | "
             "ulps median | ulps p99 | coverage |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    f = lambda v, spec=".3f": "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)  # noqa: E731
    for r in rows:
        if "flag_agreement" not in r:
            lines.append(f"| {r['op']} | {r['variant']} | {r['dtype']} | {r['cases']} | error: "
                         f"{(r.get('errors') or ['no twin'])[0][:60]} | | | | | |")
            continue
        lines.append(f"| {r['op']} | {r['variant']} | {r['dtype']} | {r['cases']} | {f(r['gpu_fault_rate'])} | "
                     f"{f(r['twin_fault_rate'])} | {f(r['flag_agreement'])} | {f(r['ulps_median'], '.2f')} | "
                     f"{f(r['ulps_p99'], '.1f')} | {f(r['coverage'])} |")
    done = [r for r in rows if "flag_agreement" in r]
    if done:
        n = sum(r["cases"] - r["device_errors"] for r in done)
        agg = lambda k: sum(r[k] * (r["cases"] - r["device_errors"]) for r in done) / n  # noqa: E731
        lines.append(f"| **all** | | | {n} | {f(agg('gpu_fault_rate'))} | {f(agg('twin_fault_rate'))} | "
                     f"{f(agg('flag_agreement'))} | | | {f(agg('coverage'))} |")
    return head + "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=300, help="random cases per triple")
    ap.add_argument("--replays", type=int, default=16, help="replays per noise mode")
    ap.add_argument("--device", default="cuda", help="where the production variants run (cuda, cpu)")
    ap.add_argument("--triton", action="store_true", help="include our Triton variants (needs triton)")
    ap.add_argument("--ops", default="", help="comma-separated ops to run (default: all)")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1), help="CPU twin processes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="a few cases per triple, R=4 (tests the script)")
    return ap.parse_args(argv)


def select_triples(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    include_triton = False
    if args.triton:
        try:
            import triton  # noqa: F401

            include_triton = True
        except ImportError:
            print("warning: --triton given but triton does not import; skipping triton variants", file=sys.stderr)
    ops = [o for o in args.ops.split(",") if o]
    unknown = [o for o in ops if o not in CATALOG]
    if unknown:
        raise SystemExit(f"error: unknown ops {unknown}; expected some of {', '.join(CATALOG)}")
    return [t for t in all_triples(include_triton=include_triton) if not ops or t[0] in ops]


def has_twin(op: str) -> bool:
    try:
        mod = twin_module(op)
    except ImportError:
        return False
    return hasattr(mod, "twin") and hasattr(mod, "reference")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        args.cases, args.replays = min(args.cases, 6), min(args.replays, 4)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is available (use --device cpu to test the script)")
        return 2
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    triples = select_triples(args)
    t0 = time.perf_counter()
    chunk = max(1, min(25, args.cases // max(1, args.workers) + 1))
    jobs: list[Job] = []
    missing: list[tuple[str, str, str]] = []
    dev_seconds: dict[tuple[str, str, str], float] = {}
    for i, triple in enumerate(triples):
        if not has_twin(triple[0]):
            missing.append(triple)
            continue
        ts = time.perf_counter()
        # The same seeds for every variant and dtype of an op: cases pair up across variants.
        jobs += device_jobs(triple, args.cases, args.seed * 1_000_003 + 1000 * list(CATALOG).index(triple[0]),
                            args.device, args.replays, chunk)
        dev_seconds[triple] = time.perf_counter() - ts
    print(f"device runs done: {len(triples) - len(missing)} triples x {args.cases} cases in "
          f"{time.perf_counter() - t0:.1f} s; twins on {args.workers} workers", file=sys.stderr)
    by_triple: dict[tuple[str, str, str], list[tuple[int, CaseResult]]] = {}
    if args.workers > 1 and len(jobs) > 1:
        with mp.get_context("spawn").Pool(args.workers) as pool:
            outs = pool.map(evaluate, jobs, chunksize=1)
    else:
        outs = [evaluate(j) for j in jobs]
    for job, out in zip(jobs, outs):
        by_triple.setdefault((job.op, job.variant, job.dtype), []).extend(out)
    rows = []
    for triple in triples:
        if triple in missing:
            rows.append({"op": triple[0], "variant": triple[1], "dtype": triple[2], "cases": 0,
                         "device_errors": 0, "errors": [f"no twin module optwin.twin.{triple[0]}"]})
            continue
        res = [r for _, r in sorted(by_triple.get(triple, []), key=lambda sr: sr[0])]
        rows.append(summarize(triple, res, dev_seconds.get(triple, 0.0)))
    meta = {"device": args.device, "cases": args.cases, "replays": args.replays, "seed": args.seed,
            "torch": torch.__version__, "seconds": time.perf_counter() - t0, "workers": args.workers,
            "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU (stand-in)"}
    table = markdown(rows, meta)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "twin_gpu.md").write_text(table)
        Path(out, "twin_gpu.json").write_text(json.dumps({"meta": meta, "triples": rows}, indent=1, default=str))
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
