"""What torch.compile generates for the norms our kernels race (issue #6): Inductor's Triton source and
launch heuristics for rmsnorm (fp32-acc) and layernorm (torch) at the timing shape, bf16.

    python bench/compile_codegen.py          # on a CUDA machine; writes $OUT/compile_codegen.md

Reads the generated module through torch._inductor's code cache (run_and_get_code), so the source is
exactly what ran; the kernel's autotune config (XBLOCK/R0_BLOCK, num_warps) is in its decorator.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/, for the modules below

import torch
from _bench_common import write_report
from gpu_kernels import OPS


def main() -> str:
    from torch._inductor.utils import run_and_get_code

    lines = [f"# torch.compile codegen, {torch.cuda.get_device_name()}, torch {torch.__version__}", ""]
    for op in ("rmsnorm", "layernorm"):
        b = OPS[op]
        inp, params = b.make((4096, 16384), torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
        fn = torch.compile(b.eager, dynamic=False)
        _, codes = run_and_get_code(fn, inp, params)
        lines += [f"## {op} ({b.variant})", "", "```python", *(c.strip() for c in codes), "```", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    write_report(main(), "compile_codegen.md")
