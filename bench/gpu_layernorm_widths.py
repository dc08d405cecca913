"""F.layer_norm on the GPU against the layernorm/torch twin, row by row, bit for bit, at widths the random
cases of bench/gpu_twin.py never take: counts that are not powers of two (12, 520, 1000: the Welford merges'
1/count is inexact there, so which product nvcc fuses shows), the strided fallback (30, 1001), and the
powers of two, on constant, near-constant, ill-conditioned and plain rows.

    python bench/gpu_layernorm_widths.py          # CUDA; prints and writes $OUT/layernorm_widths.md
    python bench/gpu_layernorm_widths.py --device cpu --rows 4   # smoke (CPU torch is not the GPU's kernel)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/, for _bench_common

from _bench_common import dtype_name, write_report  # noqa: E402
from optwin import twin  # noqa: E402

WIDTHS = (8, 12, 30, 520, 1000, 1001, 1024, 4096)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def families(n: int, rows: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """(rows, n) float32 inputs a family, before rounding to the dtype."""
    consts = torch.tensor([0.1, 1000.3, -7.77, 3.0e4, 1.0e-3, 65.5, -0.333, 12345.678])
    c = consts.repeat((rows + len(consts) - 1) // len(consts))[:rows, None]  # (rows, 1): a constant a row
    return {
        "constant": c.expand(rows, n).clone(),
        "near-constant": c * (1 + 1e-6 * torch.randn(rows, n, generator=g)),
        "ill-conditioned": 1.0e4 + torch.randn(rows, n, generator=g),
        "normal": torch.randn(rows, n, generator=g) * 3 + 0.5,
    }


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| over the elements both have finite; inf where one is finite and the other not."""
    if not torch.equal(torch.isfinite(a), torch.isfinite(b)):
        return float("inf")
    fin = torch.isfinite(a)
    return float((a[fin] - b[fin]).abs().max()) if fin.any() else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", type=int, default=8, help="rows per family, width and dtype")
    args = ap.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    lines = [f"# F.layer_norm on {torch.cuda.get_device_name() if args.device == 'cuda' else args.device} "
             f"against the layernorm/torch twin (torch {torch.__version__})", "",
             "rows bit-identical / rows (max |twin - device| where not all are)", "",
             "| dtype | family | " + " | ".join(str(n) for n in WIDTHS) + " |",
             "|---|---|" + "---:|" * len(WIDTHS)]
    same_all = total = 0
    for dt in DTYPES:
        inputs = {n: families(n, args.rows, g) for n in WIDTHS}
        for fam in ("constant", "near-constant", "ill-conditioned", "normal"):
            cells = []
            for n in WIDTHS:
                x = inputs[n][fam].to(dt)
                w = (1 + 0.1 * torch.randn(n, generator=g)).to(dt)
                b = (0.1 * torch.randn(n, generator=g)).to(dt)
                dev = torch.nn.functional.layer_norm(x.to(args.device), (n,), w.to(args.device), b.to(args.device),
                                                     1e-5).cpu().double()
                emu = twin.run("layernorm", "torch", dtype_name(dt),
                               {"x": x, "weight": w, "bias": b}).emulated.double()
                same = sum(bool(torch.equal(dev[i], emu[i])) for i in range(x.shape[0]))
                same_all, total = same_all + same, total + x.shape[0]
                cells.append(f"{same}/{x.shape[0]}" + ("" if same == x.shape[0] else f" ({max_diff(emu, dev):.2g})"))
            lines.append(f"| {dtype_name(dt)} | {fam} | " + " | ".join(cells) + " |")
    lines += ["", f"**all: {same_all} of {total} rows bit-identical**"]
    write_report("\n".join(lines) + "\n", "layernorm_widths.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
