"""Which launch torch.compile's autotuner picks for the norms our kernels race (issue #6), and what it
measured for every candidate: Inductor benchmarks a handful of configs at the first call and keeps the
fastest, so "torch.compile" is whichever candidate won that process's benchmark.

    BENCH_COMPILES=3 python bench/compile_configs.py   # on a CUDA machine; writes $OUT/compile_configs.md

Each compile runs with Inductor's caches off (a fresh autotune), the candidates' timings are recorded by
wrapping CachingAutotuner.benchmark_all_configs, and the winner is then timed with do_bench in the same
process beside y.copy_(x).
"""

from __future__ import annotations

import os

os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"  # before torch._inductor reads its config

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for `optwin`
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/, for the modules below

import torch
from _bench_common import write_report
from gpu_kernels import OPS

COMPILES = int(os.environ.get("BENCH_COMPILES", "3"))
SHAPE = (4096, 16384)


def _config_text(cfg) -> str:
    kw = ",".join(f"{k}={v}" for k, v in sorted(cfg.kwargs.items()))
    return f"{kw},warps={cfg.num_warps},stages={cfg.num_stages}"


def main() -> str:
    import triton.testing
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    seen: list[tuple[str, dict[str, float]]] = []
    original = CachingAutotuner.benchmark_all_configs

    def recording(self, *args, **kwargs):
        timings = original(self, *args, **kwargs)
        seen.append((self.fn.__name__, {_config_text(k.config): 1e3 * float(v) for k, v in timings.items()}))
        return timings

    CachingAutotuner.benchmark_all_configs = recording
    x0 = torch.randn(*SHAPE, device="cuda").to(torch.bfloat16)
    yc = torch.empty_like(x0)
    title = (f"# torch.compile's autotune, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"bf16 {SHAPE[0]}x{SHAPE[1]}, {COMPILES} fresh compiles per op")
    lines = [title, "",
             "| op | compile | candidate (autotune µs) | winner | winner µs (do_bench) | copy µs |",
             "|---|---:|---|---|---:|---:|"]
    for op in ("rmsnorm", "layernorm"):
        b = OPS[op]
        inp, params = b.make(SHAPE, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
        for i in range(COMPILES):
            torch._dynamo.reset()
            del seen[:]
            fn = torch.compile(b.eager, dynamic=False)
            fn(inp, params)
            t = 1e3 * triton.testing.do_bench(lambda fn=fn, inp=inp, params=params: fn(inp, params), warmup=10, rep=60, return_mode="median")
            tc = 1e3 * triton.testing.do_bench(lambda: yc.copy_(x0), warmup=10, rep=60, return_mode="median")
            for name, timings in seen:
                cands = "; ".join(f"{c} ({v:.1f})" for c, v in sorted(timings.items(), key=lambda kv: kv[1]))
                best = min(timings, key=timings.get)
                lines.append(f"| {op} | {i + 1} | {cands} | {best} | {t:.1f} | {tc:.1f} |")
    CachingAutotuner.benchmark_all_configs = original
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    write_report(main(), "compile_configs.md")
