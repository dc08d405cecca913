"""GPU side of `optwin validate`: run every catalog variant on held-out inputs and label the faults.

    python -m optwin.validate.collect --device cuda --cases 200 --out validate_gpu.json

(also `optwin validate --collect-only FILE --device cuda`). FILE is rewritten after every step with
what is done so far ("partial": true until the end), so a killed run still leaves results; the drift
traces run first (seconds), then the held-out cases. For each (op, dtype), held-out cases
(optwin.validate.families) are drawn on the CPU, moved to the device, sketched there with
optwin.ingest.sketch *before* the op runs (what the matcher would see online), and run through every
catalog variant with optwin.kernels.production.run_variant (the Triton kernels too when triton is
importable on CUDA). Faults are labelled exactly as the spec defines them: optwin.twin.faults
.fault_flags on the device output against the float64 reference of the twin module, computed from the
same dtype-rounded inputs. The drift traces (optwin.validate.drift) get the same treatment call by
call. Everything goes to one JSON file that `optwin validate --labels FILE --db DB` scores on a
machine with the database.

This module imports only torch and optwin.{catalog, validation, twin, ingest.sketch,
kernels.production} (the GPU machine has no duckdb/polars/scipy); a failure of one triple or case is
recorded and the run goes on.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import sys
import time
import traceback
from typing import Any, Callable

import torch

from optwin.catalog import CATALOG, operator, resolve_params
from optwin.ingest.sketch import sketch
from optwin.kernels.production import run_variant
from optwin.twin import references, to_float64
from optwin.twin.faults import fault_flags, relative_error
from optwin.validate.drift import CALLS, KINDS, RATE_HZ, TRACES, call_times, trace_inputs
from optwin.validate.families import SEED_OFFSET, held_out_case

FORMAT_VERSION = 1
MAX_CONSECUTIVE_FAILURES = 3  # a triple that fails this many times in a row (no success) is abandoned

Progress = Callable[[str], None]


def _print(msg: str) -> None:
    print(msg, flush=True)


def triton_available(device: str) -> bool:
    """Our Triton kernels run on CUDA when triton imports (on CPU only under TRITON_INTERPRET)."""
    if importlib.util.find_spec("triton") is None:
        return False
    return device.startswith("cuda") or os.environ.get("TRITON_INTERPRET") == "1"


def variants_for(op: str, include_triton: bool) -> list[str]:
    return [v.name for v in operator(op).variants if v.production or include_triton]


def _num(x: float) -> float | None:
    """JSON-safe float: non-finite relative errors become null."""
    return float(x) if math.isfinite(x) else None


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Labeller:
    """Reference of one input (float64, CPU), then labels of any variant's device output against it."""

    def __init__(self, op: str, dtype: str, inputs_cpu: dict[str, torch.Tensor], params: dict[str, Any]):
        self.op, self.dtype = op, dtype
        self.ref, self.ref_prob = references(op, to_float64(inputs_cpu), resolve_params(op, params))

    def label(self, y: torch.Tensor) -> dict[str, Any]:
        y64 = y.detach().to("cpu", torch.float64)
        flags = fault_flags(self.op, self.dtype, y64, self.ref, self.ref_prob)
        return {"labels": {k: bool(v) for k, v in flags.items()}, "rel_error": _num(float(relative_error(y64, self.ref)))}


def run_call(op: str, dtype: str, variants: list[str], inputs_cpu: dict[str, torch.Tensor], params: dict[str, Any],
             device: str, dead: set[str]) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Sketch on the device (before the op), then each variant run and labelled; per-variant errors kept."""
    inputs = {k: v.to(device) for k, v in inputs_cpu.items()}
    sk = sketch(op, inputs, params)
    lab = Labeller(op, dtype, inputs_cpu, params)
    outcomes: dict[str, dict[str, Any]] = {}
    for v in variants:
        if v in dead:
            continue
        try:
            y = run_variant(op, v, dtype, inputs, params)
            _sync(device)
            outcomes[v] = lab.label(y)
        except Exception as e:  # a broken kernel is a finding, not a crash
            outcomes[v] = {"error": _error(e)}
    return sk, outcomes


def collect_cases(device: str, n_cases: int, seed: int, ops: list[str], include_triton: bool,
                  progress: Progress = _print, deadline: float | None = None, dtypes: list[str] | None = None,
                  on_group: Callable[[list[dict[str, Any]], list[dict[str, Any]]], None] | None = None
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Held-out cases of every (op, dtype) run on the device: (case records, failure records).

    `deadline` (time.perf_counter() value): groups not started by then are skipped and recorded as
    failures, so a time-limited run still ends with a file. `on_group` sees the records so far after
    each group (checkpoints)."""
    records: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    groups = [(op, dt) for op in ops for dt in CATALOG[op].dtypes if dtypes is None or dt in dtypes]
    for gi, (op, dtype) in enumerate(groups, 1):
        t0 = time.perf_counter()
        if deadline is not None and t0 > deadline:
            failures.append({"op": op, "variant": None, "dtype": dtype, "case": None, "error": "skipped: time budget spent"})
            progress(f"[{gi}/{len(groups)}] {op}/{dtype}: skipped (time budget spent)")
            continue
        variants = variants_for(op, include_triton)
        streak = {v: 0 for v in variants}
        ok = {v: 0 for v in variants}
        faults = {v: 0 for v in variants}
        dead: set[str] = set()
        for i in range(n_cases):
            try:
                case = held_out_case(op, dtype, i, seed)
                sk, outcomes = run_call(op, dtype, variants, case.inputs, case.params, device, dead)
            except Exception as e:  # generation or sketch failed: the whole case is lost
                failures.append({"op": op, "variant": None, "dtype": dtype, "case": i, "error": _error(e)})
                continue
            for v, o in outcomes.items():
                if "error" in o:
                    failures.append({"op": op, "variant": v, "dtype": dtype, "case": i, "error": o["error"]})
                    streak[v] += 1
                    if streak[v] >= MAX_CONSECUTIVE_FAILURES and ok[v] == 0:
                        dead.add(v)
                        progress(f"  {op}/{v}/{dtype}: abandoned after {streak[v]} failures: {o['error']}")
                else:
                    streak[v] = 0
                    ok[v] += 1
                    faults[v] += any(o["labels"].values())
            records.append({"op": op, "dtype": dtype, "family": case.family, "case": i,
                            "seed": SEED_OFFSET + seed, "params": case.params, "sketch": sk, "outcomes": outcomes})
        summary = ", ".join(f"{v} {faults[v]}/{ok[v]}" for v in variants)
        progress(f"[{gi}/{len(groups)}] {op}/{dtype}: {n_cases} cases, faulting: {summary} "
                 f"({time.perf_counter() - t0:.1f}s)")
        if on_group is not None:
            on_group(records, failures)
    return records, failures


def collect_traces(device: str, seed: int, include_triton: bool, calls: int = CALLS, ops: list[str] | None = None,
                   progress: Progress = _print) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each drift trace and its flat control, call by call: sketch, then every variant labelled."""
    traces: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    times = call_times(calls)
    for spec in TRACES:
        if ops is not None and spec.op not in ops:
            continue
        variants = variants_for(spec.op, include_triton)
        for kind in KINDS:
            t0 = time.perf_counter()
            out_calls: list[dict[str, Any]] = []
            dead: set[str] = set()
            try:
                all_inputs = trace_inputs(spec, kind, seed, calls)
            except Exception as e:
                failures.append({"trace": spec.name, "kind": kind, "call": None, "error": _error(e)})
                continue
            for i, (inputs, params) in enumerate(all_inputs):
                try:
                    sk, outcomes = run_call(spec.op, spec.dtype, variants, inputs, params, device, dead)
                except Exception as e:
                    failures.append({"trace": spec.name, "kind": kind, "call": i, "error": _error(e)})
                    continue
                for v, o in outcomes.items():
                    if "error" in o:
                        failures.append({"trace": spec.name, "kind": kind, "variant": v, "call": i, "error": o["error"]})
                        dead.add(v)  # one error per stream is enough
                out_calls.append({"i": i, "t": times[i], "params": params, "sketch": sk, "outcomes": outcomes})
            first = {v: next((c["t"] for c in out_calls if any(c["outcomes"].get(v, {}).get("labels", {}).values())), None)
                     for v in variants}
            firsts = ", ".join(f"{v} {'-' if t is None else f'{t:.2f}s'}" for v, t in first.items())
            progress(f"trace {spec.name}/{kind} ({spec.dtype}, {len(out_calls)} calls): first fault {firsts} "
                     f"({time.perf_counter() - t0:.1f}s)")
            traces.append({"name": spec.name, "op": spec.op, "dtype": spec.dtype, "kind": kind, "what": spec.what,
                           "rate_hz": RATE_HZ, "variants": variants, "calls": out_calls})
    return traces, failures


def collect(device: str = "cuda", n_cases: int = 200, seed: int = 0, ops: list[str] | None = None,
            include_triton: bool | None = None, traces: bool = True, trace_calls: int = CALLS,
            progress: Progress = _print, max_seconds: float | None = None,
            checkpoint: str | os.PathLike[str] | None = None, dtypes: list[str] | None = None) -> dict[str, Any]:
    """The whole GPU side: drift traces (cheap, first) and held-out cases, as one JSON-ready dict.

    max_seconds: (op, dtype) groups not started within this budget are skipped (recorded).
    checkpoint: a path rewritten after the traces and after every group with what is done so far
    (`"partial": true`), so a run killed by a time limit still leaves its results."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} requested but torch.cuda.is_available() is False")
    ops = list(ops or CATALOG)
    for op in ops:
        operator(op)
    if include_triton is None:
        include_triton = triton_available(device)
    t0 = time.perf_counter()
    dev_name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else platform.processor() or "cpu"
    progress(f"collect on {device} ({dev_name}): {n_cases} held-out cases per (op, dtype), ops {', '.join(ops)}, "
             f"triton {'on' if include_triton else 'off'}, torch threads {torch.get_num_threads()}")
    meta = {
        "format": "optwin-validate-collect", "version": FORMAT_VERSION,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": device, "device_name": dev_name, "torch": torch.__version__,
        "triton": _triton_version() if include_triton else None, "seed": seed, "seed_offset": SEED_OFFSET,
        "cases_per_group": n_cases, "ops": ops,
    }

    def snapshot(cases: list[dict[str, Any]], failures: list[dict[str, Any]], partial: bool) -> dict[str, Any]:
        return {**meta, "partial": partial, "duration_s": time.perf_counter() - t0, "cases": cases,
                "traces": trace_records, "failures": trace_failures + failures}

    trace_records: list[dict[str, Any]] = []
    trace_failures: list[dict[str, Any]] = []
    if traces:
        trace_records, trace_failures = collect_traces(device, seed, include_triton, trace_calls, ops, progress)
    save = (lambda c, f: write_collected(snapshot(c, f, True), checkpoint)) if checkpoint is not None else None
    if save is not None:
        save([], [])
    deadline = None if max_seconds is None else t0 + max_seconds
    cases, failures = collect_cases(device, n_cases, seed, ops, include_triton, progress, deadline, dtypes, save)
    data = snapshot(cases, failures, False)
    progress(f"collected {len(cases)} cases, {len(trace_records)} traces, {len(data['failures'])} failures "
             f"in {data['duration_s']:.1f}s")
    return data


def _triton_version() -> str | None:
    try:
        import triton  # noqa: PLC0415  only when the Triton variants run

        return str(triton.__version__)
    except Exception:
        return None


def write_collected(data: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write the collection as strict JSON (no NaN/Infinity), atomically."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, allow_nan=False, separators=(",", ":"))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point for a GPU machine without typer: argparse only."""
    ap = argparse.ArgumentParser(prog="python -m optwin.validate.collect", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cases", type=int, default=200, help="held-out cases per (op, dtype)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", default="", help="comma-separated ops (default: all)")
    ap.add_argument("--dtypes", default="", help="comma-separated dtypes (default: every dtype of each op)")
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument("--no-traces", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=None, help="skip (op, dtype) groups not started by then")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        data = collect(a.device, a.cases, a.seed, [o for o in a.ops.split(",") if o] or None,
                       False if a.no_triton else None, traces=not a.no_traces, max_seconds=a.max_seconds,
                       checkpoint=a.out, dtypes=[d for d in a.dtypes.split(",") if d] or None)
    except Exception as e:
        traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_collected(data, a.out)
    print(f"wrote {a.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
