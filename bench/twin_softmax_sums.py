"""The twin against a GPU's softmax row sums and outputs (bench/gpu_softmax_sums.py's files), row by row.

    python bench/twin_softmax_sums.py bench/results/softmax_sums_gpu_h100_s49.npz [more .npz]

(The committed file keeps the row sums only; the device's full files, with the outputs and exp, were
softmax_sums_gpu_<dtype>.npz, 18 MB together: their columns are in bench/RESULTS.md.)

Per dtype and width (row counts together), how many rows the twin gets bit for bit:
- x's own float32 row sum under each reduction order the twin knows ("blocked" over 256 lanes, "cuda": torch's
  Reduce.cuh with the launch's row count, "pairwise"): the order alone, the terms being exact;
- exp(x)'s float32 row sum, the naive variant's, under the same orders, with the twin's exp (correctly rounded);
- the naive and torch variants' outputs (the deterministic emulation against the GPU's, rows that are bit-identical);
- exp(x) itself for the first rows: elements that differ from the correctly rounded exp.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_softmax_sums import rows_of  # noqa: E402

from optwin import twin  # noqa: E402
from optwin.twin.numerics import Numerics  # noqa: E402

ORDERS = ("blocked", "cuda", "pairwise")


def from_numpy(a: np.ndarray, dtype: str) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return (t.view(torch.bfloat16) if dtype == "bfloat16" else t).double()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("npz", nargs="+")
    args = ap.parse_args()
    num = Numerics()
    for path in args.npz:
        data = np.load(path)
        print(f"{path}: {' '.join(str(v) for v in data['meta'][:2])}\n")
        count: collections.Counter = collections.Counter()
        keys = sorted({k.rsplit("_", 1)[0] for k in data.files if k != "meta"},
                      key=lambda k: (k.split("_")[0], int(k.split("_")[1]), int(k.split("_")[2])))
        for key in keys:
            dtype, n, rows = key.split("_")
            n, rows = int(n), int(rows)
            xd = rows_of(dtype, n, rows)
            x = xd.double()
            e = num.round(torch.exp(x), dtype)
            cell = (dtype, n)
            count[cell + ("rows",)] += rows
            for order in ORDERS:
                for name, terms in (("xsum32", x), ("sum32", e)):
                    s = num.sum(terms, acc="float32", order=order, outputs=rows, itemsize=xd.element_size())
                    count[cell + (name, order)] += int((s == from_numpy(data[f"{key}_{name}"], "float32")).sum())
            if f"{key}_exp" in data.files:
                gpu_e = from_numpy(data[f"{key}_exp"], dtype)
                count[cell + ("exp_n",)] += gpu_e.numel()
                count[cell + ("exp_diff",)] += int((gpu_e != e).sum())
            for variant in ("naive", "torch"):
                if f"{key}_{variant}" not in data.files:
                    continue
                y = twin.run("softmax", variant, dtype, {"x": xd}).emulated
                gpu = from_numpy(data[f"{key}_{variant}"], dtype)
                same = ((y == gpu) | (y.isnan() & gpu.isnan())).all(-1)
                count[cell + (variant,)] += int(same.sum())
                count[cell + (variant + "_n",)] += rows
        cells = sorted({k[:2] for k in count}, key=lambda c: (("float16", "bfloat16", "float32").index(c[0]), c[1]))
        head = " | ".join(f"{s} {o}" for s in ("x sum", "exp sum") for o in ORDERS)
        print(f"| dtype | width | rows | {head} | naive rows | torch rows | exp elements off |")
        print("|---|---:|---:|" + "---:|" * (2 * len(ORDERS) + 3))
        for c in cells:
            sums = " | ".join(str(count[c + (s, o)]) for s in ("xsum32", "sum32") for o in ORDERS)
            kept = [f"{count[c + (a,)]}/{count[c + (b,)]}" if count[c + (b,)] else "-"
                    for a, b in (("naive", "naive_n"), ("torch", "torch_n"), ("exp_diff", "exp_n"))]
            print(f"| {c[0]} | {c[1]} | {count[c + ('rows',)]} | {sums} | {' | '.join(kept)} |")
        print()


if __name__ == "__main__":
    main()
