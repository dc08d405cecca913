"""The twin against a GPU on layernorm's exactly constant rows (bench/gpu_constant_rows.py's output), row by row.

    python bench/twin_constant_rows.py bench/results/constant_rows_gpu_h100_s48.json [--rows 64] [--replays 16]

Per variant/dtype/width: how many rows fault on the GPU, how many the deterministic twin flags, how many of those
agree, and the mean fraction of stochastic-rounding replays that fault (the noise the build's cells average).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_constant_rows import rows_of  # noqa: E402

from optwin import twin  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gpu_json")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--replays", type=int, default=16)
    args = ap.parse_args()
    data = json.load(open(args.gpu_json))
    tau = {"float16": 16 * 2.0**-11, "bfloat16": 16 * 2.0**-8, "float32": 16 * 2.0**-24}
    print(f"GPU: {data['device']}; first {args.rows} of {data['rows']} rows per cell; {args.replays} stochastic replays\n")
    print("| variant | dtype | width | GPU faults | twin faults | agree | replays faulting (mean) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for key, res in data["results"].items():
        variant, dtype, n = key.split("/")
        inp = rows_of(dtype, int(n), data["rows"])
        agree = gpu_n = twin_n = 0
        frac = 0.0
        for i in range(args.rows):
            row = {"x": inp["x"][i:i + 1], "weight": inp["weight"], "bias": inp["bias"]}
            gpu = bool(res["nonfinite"][i]) or res["rel_error"][i] > tau[dtype]
            r = twin.run("layernorm", variant, dtype, row, noise="stochastic", replays=args.replays, seed=i)
            det = any(r.faults.values())
            rep = torch.stack([v for v in r.replay_faults.values()]).any(0).float().mean().item()
            gpu_n += gpu
            twin_n += det
            agree += gpu == det
            frac += rep / args.rows
        print(f"| {variant} | {dtype} | {n} | {gpu_n} | {twin_n} | {agree} of {args.rows} | {frac:.2f} |")


if __name__ == "__main__":
    main()
