"""The in-process monitor on CUDA: warnings before the fault, no host synchronisation on the hot path.

    python bench/gpu_monitor.py --rows rows.json [--steps 160]

`rows.json` holds fingerprint rows (the `fingerprints` table as a JSON list; the GPU machine has no
DuckDB, so the matcher is built with `Matcher.from_rows`). Make it on the CPU machine with
`python bench/gpu_monitor.py --export fingerprints.duckdb --rows rows.json`.

The demo's float16 model (rmsnorm/native-dtype norms, embeddings growing 4 % a step) runs on the GPU
under `optwin.monitor(policy="warn")`. Every forward runs under `torch.cuda.set_sync_debug_mode("error")`:
a synchronising call anywhere on the hot path (an `.item()`, a blocking copy) raises. The norm inputs
are kept and labelled by the twin after the loop, to measure the warning's lead time. Per-forward
time watched vs unwatched is measured with CUDA events in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def export_rows(db: str, path: str, ops: tuple[str, ...] = ("rmsnorm",)) -> None:
    from optwin.fingerprints.store import open_store

    store = open_store(db, read_only=True)
    try:
        rows = [r for r in store.fingerprints(store.latest_build_id()) if r["op"] in ops]
    finally:
        store.close()
    with open(path, "w") as f:
        json.dump(rows, f, default=str)
    print(f"wrote {len(rows)} fingerprint rows to {path}")


def timed_forwards(model, ids_list, device_sync) -> list[float]:
    import torch

    times = []
    for ids in ids_list:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(ids)
        end.record()
        times.append((start, end))
    device_sync()
    return [s.elapsed_time(e) for s, e in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", required=True)
    ap.add_argument("--export", help="CPU side: a fingerprint database to export rows from")
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--no-sync-check", action="store_true", help="run without the sync debug mode")
    args = ap.parse_args()
    if args.export:
        export_rows(args.export, args.rows)
        return

    import statistics

    import torch

    import optwin
    from optwin import twin
    from optwin.demo import DemoConfig, make_model, norm_modules
    from optwin.fingerprints.matcher import Matcher

    assert torch.cuda.is_available(), "needs a CUDA device"
    with open(args.rows) as f:
        matcher = Matcher.from_rows(json.load(f))
    cfg = DemoConfig()
    model = make_model(cfg).cuda()
    first_norm = dict(norm_modules(model))["layers.0.norm"]
    g = torch.Generator(device="cuda").manual_seed(cfg.seed)
    ids_list = [torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), device="cuda", generator=g) for _ in range(32)]

    with torch.no_grad():  # unwatched reference timing (embeddings not drifting yet)
        timed_forwards(model, ids_list[:8], torch.cuda.synchronize)
        plain_ms = timed_forwards(model, ids_list, torch.cuda.synchronize)

    clock = {"t": 0.0}
    warnings: list[dict] = []
    kept: list[torch.Tensor] = []
    hook = first_norm.register_forward_pre_hook(lambda mod, a: kept.append(a[0].detach().clone()))
    sync_errors = 0
    watched_ms: list[float] = []
    mon = optwin.monitor(model, matcher=matcher, policy="warn", ops=("rmsnorm",), sampling="always",
                         callbacks=[warnings.append], clock=lambda: clock["t"])
    with mon, torch.no_grad():
        for step in range(args.steps):
            clock["t"] = step / cfg.rate_hz
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.set_sync_debug_mode(0 if args.no_sync_check else "error")
            try:
                start.record()
                model(ids_list[step % len(ids_list)])
                end.record()
            except RuntimeError as e:  # a synchronising call on the hot path
                sync_errors += 1
                print(f"step {step}: synchronisation on the hot path: {str(e)[:160]}")
            finally:
                torch.cuda.set_sync_debug_mode(0)
            watched_ms.append((start, end))
            model.embed.weight.mul_(cfg.growth)
        mon.flush()
    hook.remove()
    torch.cuda.synchronize()
    watched = [s.elapsed_time(e) for s, e in watched_ms]

    first_fault = None
    w = first_norm.weight.detach().cpu()
    for step, x in enumerate(kept):
        faults = twin.run("rmsnorm", "native-dtype", "float16", {"x": x.cpu().reshape(-1, x.shape[-1]), "weight": w}).faults
        if any(faults.values()):
            first_fault = step / cfg.rate_hz
            break
    mine = [wr for wr in warnings if str(wr.get("stream", "")).startswith("layers.0.norm")]
    first_warn = min((float(wr["t"]) for wr in mine), default=None)
    lead = None if first_warn is None or first_fault is None else first_fault - first_warn
    result = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": args.steps,
        "sync_errors_on_hot_path": sync_errors, "warnings": len(warnings),
        "first_warning_t": first_warn, "first_fault_t": first_fault, "lead_s": lead,
        "monitor_stats": getattr(mon.stats, "__dict__", str(mon.stats)),
        "skipped_reasons": dict(mon._rec.skipped) if mon._rec is not None else {},
        "forward_ms_unwatched_median": statistics.median(plain_ms),
        "forward_ms_watched_median": statistics.median(watched[10:]),
    }
    print(json.dumps(result, indent=1, default=str))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_monitor.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
