"""Benchmark entry for optwin.kernels: runs bench/gpu_kernels.py on CUDA, else says it needs a GPU.

    python bench/bench_kernels.py          # OUT=dir also writes dir/kernels.md
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench_kernels: needs a CUDA GPU (none found); nothing measured")
        return 0
    import gpu_kernels

    return gpu_kernels.main()


if __name__ == "__main__":
    from _bench_common import watchdog

    watchdog()
    raise SystemExit(main())
