"""The twin against a GPU on layernorm's exactly constant rows (bench/gpu_constant_rows.py's output), row by row.

    python bench/twin_constant_rows.py bench/results/constant_rows_gpu_h100_s48.json [--rows 64] [--replays 16]

Per variant/dtype/width: how many rows fault on the GPU, how many the deterministic twin flags, how many of those
agree, and the mean fraction of stochastic-rounding replays that fault (the noise the build's cells average).
The twin runs all rows in one call, as the GPU did: torch's reduce sizes its blocks by the rows of a launch.
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
        # one launch of every row, as on the GPU: torch's reduce sizes its blocks by the rows of the call
        r = twin.run("layernorm", variant, dtype, inp, noise="stochastic", replays=args.replays, seed=0,
                     keep_replays=True)
        det = _row_faults(r.emulated, r.exact, tau[dtype])[: args.rows]
        rep = torch.stack([_row_faults(y, r.exact, tau[dtype]) for y in r.replays]).float().mean(0)[: args.rows]
        gpu = torch.tensor([bool(b) or e > tau[dtype] for b, e in zip(res["nonfinite"], res["rel_error"])])[: args.rows]
        print(f"| {variant} | {dtype} | {n} | {int(gpu.sum())} | {int(det.sum())} | {int((gpu == det).sum())} of "
              f"{args.rows} | {rep.mean().item():.2f} |")


def _row_faults(y: torch.Tensor, r: torch.Tensor, tau: float) -> torch.Tensor:
    """Per row (rows,): nonfinite, or ||y - r|| / ||r|| past tau (the catalog's faults, row by row)."""
    bad = ~torch.isfinite(y).all(-1)
    err = (y - r).norm(dim=-1) / r.norm(dim=-1)
    return bad | (torch.nan_to_num(err, nan=float("inf")) > tau)


if __name__ == "__main__":
    main()
