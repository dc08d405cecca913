"""The Triton code torch.compile generates for a production variant, to compare its launch with ours
(issue #6's "at least as fast as torch.compile").

    python bench/inductor_code.py rmsnorm 4096x16384 bfloat16   # on a CUDA machine; $OUT/inductor_<op>.py

Writes every generated source of the compiled call (Inductor's kernels with their launch heuristics:
XBLOCK/R0_BLOCK, num_warps, num_stages, eviction policies) to stdout and to $OUT when OUT is set.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/

import torch
from gpu_kernels import OPS
from torch._inductor.utils import run_and_get_code


def main() -> None:
    if not torch.cuda.is_available():
        print("bench/inductor_code.py needs a CUDA GPU (what Inductor generates depends on it)")
        return
    op, shape, dtype = sys.argv[1], tuple(int(v) for v in sys.argv[2].split("x")), getattr(torch, sys.argv[3])
    bench = OPS[op]
    inp, params = bench.make(shape, dtype, "cuda", torch.Generator().manual_seed(0))
    fn = torch.compile(lambda i: bench.eager(i, params))
    _, sources = run_and_get_code(fn, inp)
    text = "\n\n# ----------------------------------------------------------------\n\n".join(sources)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"inductor_{op}.py").write_text(text)


if __name__ == "__main__":
    main()
