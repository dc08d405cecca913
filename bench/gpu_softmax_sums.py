"""Softmax's row sums on a GPU, kept row by row, so the twin's reduction orders can be checked on the CPU
(bench/twin_softmax_sums.py).

    python bench/gpu_softmax_sums.py            # CUDA; writes $OUT/softmax_sums_gpu_<dtype>.npz
    python bench/gpu_softmax_sums.py --smoke    # CPU dry run, two widths

For each dtype, width and row count: x = 1 + 1.5 N(0, 1) in the dtype, seeded on the CPU (`rows_of`) so the twin
sees the same rows. Kept: x.sum(-1) in float32 (terms the CPU knows exactly: the reduce order alone), the naive
variant's sum exp(x).sum(-1) in float32 (the same reduce kernel as its
dtype sum, whose order it shows in full) and in the dtype, and the outputs of softmax naive and torch.softmax
for row counts up to OUTPUT_ROWS, and exp(x) for up to EXP_ROWS (float32's exp is not correctly rounded on the
GPU; the files stay small).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch

WIDTHS = (64, 100, 128, 130, 384, 768, 1000, 1024, 2048, 4096, 8192)
ROW_COUNTS = (1, 8, 64, 512)
OUTPUT_ROWS = 64
EXP_ROWS = 8
DTYPES = ("float16", "bfloat16", "float32")


def rows_of(dtype: str, n: int, rows: int) -> torch.Tensor:
    """The seeded CPU rows of one (dtype, width, row count): (rows, n) in dtype."""
    g = torch.Generator().manual_seed(100000 * DTYPES.index(dtype) + 10 * n + ROW_COUNTS.index(rows))
    return (1.0 + 1.5 * torch.randn(rows, n, generator=g, dtype=torch.float64)).to(getattr(torch, dtype))


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """bfloat16 has no numpy dtype: its bits travel as int16."""
    t = t.cpu()
    return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    from optwin.kernels.production import softmax_naive

    device = "cpu" if args.smoke else "cuda"
    widths = WIDTHS[:2] if args.smoke else WIDTHS
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    t0 = time.time()
    for dtype in DTYPES:  # a file each: the 16 MiB a file that comes back from the device
        arrays: dict[str, np.ndarray] = {}
        for n in widths:
            for rows in ROW_COUNTS:
                x = rows_of(dtype, n, rows).to(device)
                e = torch.exp(x)
                key = f"{dtype}_{n}_{rows}"
                arrays[f"{key}_xsum32"] = as_numpy(x.sum(-1, dtype=torch.float32))  # known terms: the order alone
                arrays[f"{key}_sum32"] = as_numpy(e.sum(-1, dtype=torch.float32))
                arrays[f"{key}_sum"] = as_numpy(e.sum(-1))
                if rows <= EXP_ROWS:
                    arrays[f"{key}_exp"] = as_numpy(e)
                if rows <= OUTPUT_ROWS:
                    arrays[f"{key}_naive"] = as_numpy(softmax_naive(x))
                    arrays[f"{key}_torch"] = as_numpy(torch.softmax(x, -1))
        arrays["meta"] = np.array([name, torch.__version__, str(widths), str(ROW_COUNTS)])
        out = Path(os.environ.get("OUT", ".")) / f"softmax_sums_gpu_{dtype}.npz"
        np.savez_compressed(out, **arrays)
        print(f"{name}: {len(arrays) - 1} arrays in {time.time() - t0:.1f} s -> {out} ({out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
