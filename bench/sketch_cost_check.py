"""Why bench/gpu_kernels.py read rmsnorm's sketch at +16 % (stop 19) where stop 18's norm_chunks and
timing_modes read +5 %: the sketched launch timed (do_bench) with its row records placed anew several
times in one process, and after torch.compile ran (the other two benches compile first).

    python bench/sketch_cost_check.py      # CUDA; prints (bench/results/sketch_cost_check_h200_s19.md)

Neither mattered: the cause was f600a50's code (bench/results/norm_chunks_h200_s19d.md)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import torch
import triton.testing
from gpu_kernels import OPS

from optwin.kernels import sketch_buffer
from optwin.kernels.sketch_buffer import new_buffer

SHAPE = (4096, 16384)
b = OPS["rmsnorm"]
inp, params = b.make(SHAPE, torch.bfloat16, "cuda", torch.Generator().manual_seed(1))
y, buf = torch.empty_like(inp["x"]), new_buffer("rmsnorm", "cuda")
plain, sk = (lambda: b.launch(inp, params, y, None)), (lambda: b.launch(inp, params, y, buf))


def timed(label: str) -> None:
    a = triton.testing.do_bench(plain, warmup=10, rep=40, return_mode="median")
    s = triton.testing.do_bench(sk, warmup=10, rep=40, return_mode="median")
    words = next(iter(sketch_buffer._RECORDS.values()))[0]
    print(f"{label}: kernel {a * 1e3:.1f} sketch {s * 1e3:.1f} ({100 * (s / a - 1):+.1f}%) "
          f"records at {words.data_ptr():#x} (mod 2 MB {words.data_ptr() % (2 << 20):#x})", flush=True)


keep = []
timed("first")
for k in range(6):
    sketch_buffer._RECORDS.clear()
    keep.append(torch.empty((k + 1) * 37 * 1024 + 8 * k, dtype=torch.uint8, device="cuda"))  # shift the next allocation
    sk()
    timed(f"placement {k + 1}")
fn = torch.compile(b.eager, dynamic=False)
fn(inp, params)
timed("after torch.compile")
sketch_buffer._RECORDS.clear()
sk()
timed("after torch.compile, new records")
