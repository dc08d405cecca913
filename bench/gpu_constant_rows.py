"""Layernorm's exactly constant rows on a GPU: does each variant's output fault, row by row, at widths that are
and are not powers of two? The twin's answers are compared on the CPU (bench/twin_constant_rows.py).

    python bench/gpu_constant_rows.py            # CUDA; writes $OUT/constant_rows_gpu.json
    python bench/gpu_constant_rows.py --smoke    # CPU dry run (torch variants only), 8 rows per width

Rows: for each dtype and width, ROWS constant rows x = c (c log-uniform in [1, 1e4], rounded to the dtype, seeded
on the CPU so the twin sees the same), weight 1 + 0.1 N(0, 1) and bias 0.3 N(0, 1) per width, in the dtype.
Per row: nonfinite (any NaN/inf) and ||y - r|| / ||r|| against the float64 reference.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch

WIDTHS = (384, 768, 1024, 2048, 4096)
DTYPES = ("float16", "bfloat16", "float32")
ROWS = 256


def rows_of(dtype: str, n: int, rows: int) -> dict[str, torch.Tensor]:
    """The seeded CPU inputs of one (dtype, width): x (rows, n), weight (n,), bias (n,), all in dtype."""
    g = torch.Generator().manual_seed(1000 * DTYPES.index(dtype) + n)
    t = getattr(torch, dtype)
    c = torch.exp(torch.rand(rows, generator=g, dtype=torch.float64) * math.log(1e4))  # (rows,) in [1, 1e4)
    x = c.to(t).unsqueeze(-1).expand(rows, n).contiguous()  # (rows, n)
    w = (1 + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)).to(t)
    b = (0.3 * torch.randn(n, generator=g, dtype=torch.float64)).to(t)
    return {"x": x, "weight": w, "bias": b}


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    h = x.double()
    m = h.mean(-1, keepdim=True)
    var = ((h - m) ** 2).mean(-1, keepdim=True)
    return (h - m) * torch.rsqrt(var + 1e-5) * w.double() + b.double()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    from optwin.kernels.production import run_variant

    device = "cpu" if args.smoke else "cuda"
    rows = 8 if args.smoke else ROWS
    variants = ("torch", "one-pass") if args.smoke else ("torch", "one-pass", "triton")
    out: dict[str, object] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                              "torch": torch.__version__, "rows": rows, "widths": WIDTHS, "results": {}}
    t0 = time.time()
    for dtype in DTYPES:
        for n in WIDTHS:
            inp = rows_of(dtype, n, rows)
            dev = {k: v.to(device) for k, v in inp.items()}
            r = reference(dev["x"], dev["weight"], dev["bias"])  # (rows, n) float64
            for variant in variants:
                y = run_variant("layernorm", variant, dtype, dev).double()  # (rows, n)
                bad = ~torch.isfinite(y).all(-1)  # (rows,)
                err = (y - r).norm(dim=-1) / r.norm(dim=-1)  # (rows,)
                out["results"][f"{variant}/{dtype}/{n}"] = {
                    "c": inp["x"][:, 0].double().tolist(), "nonfinite": bad.tolist(),
                    "rel_error": torch.nan_to_num(err, nan=math.inf).tolist()}
    out["seconds"] = time.time() - t0
    dst = Path(os.environ.get("OUT", ".")) / "constant_rows_gpu.json"
    dst.write_text(json.dumps(out))
    for k, v in out["results"].items():
        print(k, "nonfinite", sum(v["nonfinite"]), "max err %.3g" % max(v["rel_error"]))


if __name__ == "__main__":
    main()
