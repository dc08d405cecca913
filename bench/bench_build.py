"""Build throughput: replays/s per op, 1 vs 2 workers (local pool and Ray), and gather/aggregate of 1 M rows.

    python bench/bench_build.py [--cases 12] [--replays 16] [--rows 1000000] [--skip-ray]

Part 1 runs the same small build (every catalog op) four times: engine local and ray, 1 and 2 workers.
Per op it reports replays per second of shard time (one worker's rate), and per run the wall time of
the shard phase, so scaling efficiency = rate(2 workers) / (2 * rate(1 worker)) over the whole phase.
Part 2 writes 1 M synthetic per-case rows as 20 shard files and times DuckDB gather + aggregation.
Numbers depend on machine load: the load average is printed with them, and "CPU got/asked" (shard CPU
seconds / (shard phase wall x workers)) shows how much of the asked-for cores the workers really got.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402


def run_builds(cases: int, replays: int, engines: list[str]) -> list[dict]:
    from optwin.fingerprints.build import BuildConfig, build

    runs = []
    for engine in engines:
        for workers in (1, 2):
            with tempfile.TemporaryDirectory() as d:
                per_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # op -> [replays, shard seconds]
                cpu = [0.0]
                load0 = os.getloadavg()[0]

                def on_shard(s: dict) -> None:
                    per_op[s["op"]][0] += s["replays"]
                    per_op[s["op"]][1] += s["seconds"]
                    cpu[0] += s.get("cpu_s", 0.0)

                res = build(BuildConfig(out=os.path.join(d, "fp.duckdb"), cases=cases, replays=replays, seed=0,
                                        engine=engine, workers=workers), on_shard=on_shard)
                runs.append({"engine": engine, "workers": workers, "run_s": res.run_s, "gather_s": res.gather_s,
                             "replays": res.replays, "cases": res.cases, "load": (load0 + os.getloadavg()[0]) / 2,
                             "cpu_util": cpu[0] / (res.run_s * workers),
                             "per_op": {op: r / s for op, (r, s) in per_op.items()}})
    return runs


def synthetic_shards(d: str, rows: int, files: int = 20) -> list[str]:
    """Per-case rows shaped like real shards: 7 ops' region features, ~5% faults, 20% held out."""
    import numpy as np
    import polars as pl

    from optwin.catalog import CATALOG, all_triples
    from optwin.fingerprints.regions import feature_bin
    from optwin.fingerprints.shards import polars_schema

    rng = np.random.default_rng(0)
    triples = all_triples()
    paths = []
    per = rows // files
    for fi in range(files):
        op, variant, dtype = triples[fi % len(triples)]
        feats = CATALOG[op].region_features
        # features on a coarse log grid (8 decades): a few hundred regions per triple, like a sweep
        vals = {f: 1.1 * 10.0 ** rng.integers(-3, 5, per) for f in feats}
        grid = {f: np.unique(vals[f]) for f in feats}
        bins = {f: {v: feature_bin(f, float(v)) for v in grid[f]} for f in feats}  # the real binning, per distinct value
        cols = [np.array([bins[f][v] for v in vals[f]]).astype(str) for f in feats]
        keys = cols[0]
        for c in cols[1:]:
            keys = np.char.add(np.char.add(keys, "|"), c)
        n_rep = 16
        has_le = "low_entropy" in CATALOG[op].fault_types
        data = {
            "case_id": np.arange(fi * per, (fi + 1) * per, dtype=np.int64) * 7919 + 1,
            "op": [op] * per, "variant": [variant] * per, "dtype": [dtype] * per, "source": ["default"] * per,
            "family": ["normal"] * per, "seed": np.full(per, 3, dtype=np.int64), "case_index": np.arange(per, dtype=np.int32),
            "shard": [f"synthetic.{fi:03d}"] * per, "region": keys.tolist(),
            "sketch": [json.dumps({f: float(vals[f][0]) for f in feats})] * per, "params": ["{}"] * per,
            "held_out": rng.random(per) < 0.2, "replays": np.full(per, n_rep, dtype=np.int32), "noise": ["stochastic"] * per,
        }
        for fault, p in (("nonfinite", 0.02), ("precision_loss", 0.05), ("low_entropy", 0.05)):
            k = rng.binomial(n_rep, p, per).astype(np.int32)
            if fault == "low_entropy" and not has_le:
                data[f"det_{fault}"], data[f"n_{fault}"] = [None] * per, [None] * per
            else:
                data[f"det_{fault}"], data[f"n_{fault}"] = k > n_rep // 2, k
        err = 10 ** rng.uniform(-8, 0, per)
        data.update(det_rel_error=err, err_q50=err, err_q90=err * 2, err_max=err * 3)
        for i in range(4):
            data[f"f{i}"] = vals[feats[i]] if i < len(feats) else [None] * per
        df = pl.DataFrame(data, schema=polars_schema())
        path = os.path.join(d, f"s{fi:03d}.parquet")
        df.write_parquet(path)
        paths.append(path)
    return paths


def bench_gather(rows: int) -> dict:
    import datetime as dt

    from optwin.fingerprints.store import open_store

    with tempfile.TemporaryDirectory() as d:
        paths = synthetic_shards(d, rows)
        t0 = time.perf_counter()
        with open_store(os.path.join(d, "g.duckdb"), read_only=False, create=True) as s:
            counts = s.add_build({"build_id": "bench", "created_at": dt.datetime.now(), "seed": 0, "flags": "{}",
                                  "replays": 16, "noise": "stochastic", "engine": "bench", "duration_s": 0.0}, paths)
            s.checkpoint()
        counts["total_s"] = time.perf_counter() - t0
        counts["db_mb"] = os.path.getsize(os.path.join(d, "g.duckdb")) / 2**20
    return counts


def estimate_presets(sample: int = 24) -> list[dict]:
    """CPU seconds per case per op (process time: independent of machine load) on a sample of each
    op's default and boundary sweeps, scaled to each preset's plan: the build time on N idle cores."""
    import torch

    from optwin.catalog import all_triples
    from optwin.fingerprints.build import PRESETS
    from optwin.fingerprints.shards import ShardSpec, _case_row
    from optwin.fingerprints.sources import generate

    torch.set_num_threads(1)
    triples = all_triples()
    out = []
    for preset in PRESETS.values():
        total = 0.0
        for op in sorted({t[0] for t in triples}):
            mine = [t for t in triples if t[0] == op]
            cpu, n = 0.0, 0
            for i, (_, variant, dtype) in enumerate(mine[:: max(1, len(mine) // 3)][:3]):  # 3 variants/dtypes per op
                for source in ("default", "sweep"):
                    cases = generate(source, op, dtype, sample, 100 + i)
                    spec = ShardSpec(op, variant, dtype, source, 0, 1, sample, 100 + i, preset.replays, "stochastic", 0)
                    c0 = time.process_time()
                    for c in cases:
                        _case_row(spec, c, None)
                    cpu += time.process_time() - c0
                    n += len(cases)
            total += cpu / n * preset.cases * 2 * len(mine)  # 2 sources x cases, every variant/dtype
        out.append({"preset": preset.name, "cases": preset.cases, "replays": preset.replays, "cpu_s": total})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=12)
    ap.add_argument("--replays", type=int, default=16)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--skip-estimate", action="store_true")
    args = ap.parse_args()
    console = Console(width=160)
    console.print(f"cores: {os.cpu_count()}  load average at start: {os.getloadavg()[0]:.1f}")

    runs = run_builds(args.cases, args.replays, ["local"] + ([] if args.skip_ray else ["ray"]))
    ops = sorted({op for r in runs for op in r["per_op"]})
    t = Table(title=f"replays/s per op (one worker's rate over shard time; {args.cases} cases x {args.replays} replays per generator call)")
    for c in ("engine", "workers", *ops, "total replays", "shard phase s", "replays/s (wall)", "scaling eff.", "CPU got/asked", "gather s", "load"):
        t.add_column(c, justify="right")
    base = {}
    for r in runs:
        wall_rate = r["replays"] / r["run_s"]
        if r["workers"] == 1:
            base[r["engine"]] = wall_rate
        eff = wall_rate / (r["workers"] * base[r["engine"]]) if r["engine"] in base else float("nan")
        t.add_row(r["engine"], str(r["workers"]), *[f"{r['per_op'].get(op, 0):,.0f}" for op in ops], f"{r['replays']:,}",
                  f"{r['run_s']:.1f}", f"{wall_rate:,.0f}", f"{eff:.2f}", f"{r['cpu_util']:.2f}", f"{r['gather_s']:.2f}", f"{r['load']:.1f}")
    console.print(t)

    if not args.skip_estimate:
        t3 = Table(title="preset build time from CPU seconds per case (load-independent), shard phase only")
        for c in ("preset", "cases/call", "replays", "CPU s", "est. wall s on 2 idle cores"):
            t3.add_column(c, justify="right")
        for e in estimate_presets():
            t3.add_row(e["preset"], str(e["cases"]), str(e["replays"]), f"{e['cpu_s']:.0f}", f"{e['cpu_s'] / 2:.0f}")
        console.print(t3)

    g = bench_gather(args.rows)
    t2 = Table(title=f"gather + aggregate of {g['cases']:,} synthetic outcome rows (20 shard files)")
    for c in ("rows", "fingerprints", "representatives", "gather s", "aggregate s", "commit s", "total s", "rows/s", "db MiB"):
        t2.add_column(c, justify="right")
    t2.add_row(f"{g['cases']:,}", f"{g['fingerprints']:,}", f"{g['representatives']:,}", f"{g['gather_s']:.2f}",
               f"{g['aggregate_s']:.2f}", f"{g['commit_s']:.2f}", f"{g['total_s']:.2f}",
               f"{g['cases'] / g['total_s']:,.0f}", f"{g['db_mb']:.1f}")
    console.print(t2)


if __name__ == "__main__":
    main()
