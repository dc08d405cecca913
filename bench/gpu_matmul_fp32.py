"""float32 matmul on the GPU (TF32 off, torch's default) at k up to 16384: the outputs and the kernels cuBLAS
picks, for the CPU to hold against the matmul twin's model (exact 32-wide k chunks accumulated in fp32) and a
sequential-FFMA model (one fp32 FMA per k step, as a SIMT sgemm thread accumulates).

    python bench/gpu_matmul_fp32.py          # CUDA; writes $OUT/matmul_fp32.pt (outputs, kernels)
    python bench/gpu_matmul_fp32.py --compare matmul_fp32.pt   # anywhere: the models against those outputs

Inputs come from seeded CPU generators, so only the outputs travel.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

SHAPES = ((8, 1024, 8), (8, 4096, 8), (8, 16384, 8), (64, 4096, 64), (256, 4096, 256), (128, 16384, 128),
          (512, 4096, 512))


def inputs(shape: tuple[int, int, int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, k, n = shape
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)


def collect() -> dict:
    from torch.profiler import ProfilerActivity, profile

    torch.backends.cuda.matmul.allow_tf32 = False
    out = {"device": torch.cuda.get_device_name(), "torch": str(torch.__version__), "runs": []}
    for i, shape in enumerate(SHAPES):
        a, b = inputs(shape, i)
        ad, bd = a.cuda(), b.cuda()
        y = ad @ bd
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            y2 = ad @ bd
            torch.cuda.synchronize()
        kernels = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
        out["runs"].append({"shape": list(shape), "seed": i, "y": y.cpu(), "same_twice": bool(torch.equal(y, y2)),
                            "kernels": kernels})
        print(shape, kernels, flush=True)
    return out


def ffma_chain(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Each output one fp32 accumulator, s = fma(a[:, j], b[j, :], s) for j = 0..k-1, rounded once a step."""
    from optwin.twin.numerics import fma_odd

    a64, b64 = a.double(), b.double()
    s = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for j in range(a.shape[1]):
        s = fma_odd(a64[:, j:j + 1], b64[j:j + 1, :], s).float().double()
    return s


def compare(path: str) -> str:
    from optwin import twin

    data = torch.load(path)
    lines = [f"# float32 matmul on {data['device']} (torch {data['torch']}, TF32 off) against the models", "",
             "| m x k x n | kernels | rel. error GPU | twin (32-chunks) | FFMA chain | GPU == twin | GPU == FFMA chain |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for run in data["runs"]:
        a, b = inputs(tuple(run["shape"]), run["seed"])
        exact = a.double() @ b.double()
        gpu = run["y"].double()
        tw = twin.run("matmul", "torch", "float32", {"a": a, "b": b}).emulated
        ch = ffma_chain(a, b)

        def rel(y: torch.Tensor) -> float:
            return float((y - exact).norm() / exact.norm())

        def same(y: torch.Tensor) -> str:
            return f"{float((y == gpu).double().mean()):.3f}"

        m, k, n = run["shape"]
        lines.append(f"| {m}x{k}x{n} | {', '.join(kn[:60] for kn in run['kernels'])} | {rel(gpu):.3g} | {rel(tw):.3g} "
                     f"| {rel(ch):.3g} | {same(tw)} | {same(ch)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if "--compare" in sys.argv:
        print(compare(sys.argv[sys.argv.index("--compare") + 1]))
    else:
        res = collect()
        torch.save(res, os.path.join(os.environ.get("OUT", "."), "matmul_fp32.pt"))
