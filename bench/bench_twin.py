"""python bench/bench_twin.py [--replays 32] [--noise stochastic] [--repeat 5] [--threads 1]

Cost of the twins on this machine, in one run:
- `twin / f64`: the deterministic emulated twin (noise "none") against plain float64 torch of the
  same math (the module's `reference`) -- the goal is <= 3x;
- `replays/s`: R noisy replays (batched in one call, noise mode `--noise`) per second;
- GFLOP/s of the attention / matmul twins (counting the float64 multiply-adds of the math) next to
  torch.mm in float64 on the same machine.
Shapes: rmsnorm [16, 4096], softmax [16, 4096], attention [1, 4, 512, 128], matmul [256, 4096] x [4096, 256].
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from optwin.catalog import resolve_params
from optwin.twin import to_float64, twin_module
from optwin.twin.numerics import Numerics

DTYPE = "float16"


def cases() -> list[tuple[str, str, dict[str, torch.Tensor], float]]:
    """(op, variant, inputs in DTYPE, float64 flops of the math or 0)."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).half()
    b, h, s, d = 1, 4, 512, 128
    m, k, n = 256, 4096, 256
    att = {"q": r(b, h, s, d), "k": r(b, h, s, d), "v": r(b, h, s, d)}
    att_flops = 4.0 * b * h * s * s * d
    mm = {"a": r(m, k), "b": r(k, n)}
    return [
        ("rmsnorm", "fp32-acc", {"x": r(16, 4096), "weight": r(4096)}, 0.0),
        ("rmsnorm", "native-dtype", {"x": r(16, 4096), "weight": r(4096)}, 0.0),
        ("softmax", "torch", {"x": r(16, 4096)}, 0.0),
        ("softmax", "naive", {"x": r(16, 4096)}, 0.0),
        ("softmax", "triton", {"x": r(16, 4096)}, 0.0),
        ("attention", "sdpa", att, att_flops),
        ("attention", "math", att, att_flops),
        ("matmul", "torch", mm, 2.0 * m * k * n),
    ]


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """Smallest wall time of `repeat` calls after one warm-up call, in seconds."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def mm_gflops(repeat: int) -> float:
    a = torch.randn(1024, 1024, dtype=torch.float64)
    return 2 * 1024**3 / best_of(lambda: torch.mm(a, a), repeat) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replays", type=int, default=32)
    ap.add_argument("--noise", default="stochastic", choices=("stochastic", "mca", "order"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: stable ratios on a shared machine, where OpenMP spinning distorts)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, dtype {DTYPE}, "
          f"R = {args.replays} {args.noise} replays")
    print(f"torch.mm float64 [1024]^3: {mm_gflops(args.repeat):.1f} GFLOP/s")
    head = f"{'op/variant':<22}{'shape':<26}{'f64 ms':>9}{'twin ms':>9}{'twin/f64':>9}{'replays/s':>11}{'twin GF/s':>10}"
    print(head)
    print("-" * len(head))
    for op, variant, inputs, flops in cases():
        print(row(op, variant, inputs, flops, args))


def row(op: str, variant: str, inputs: dict[str, torch.Tensor], flops: float, args: argparse.Namespace) -> str:
    """One table row: reference and twin times, their ratio, noisy replays/s, twin GFLOP/s."""
    mod = twin_module(op)
    p = resolve_params(op, {})
    x = to_float64(inputs)
    t_ref = best_of(lambda: mod.reference(x, p), args.repeat)
    t_twin = best_of(lambda: mod.twin(Numerics("none"), variant, DTYPE, x, p), args.repeat)

    def noisy() -> torch.Tensor:
        num = Numerics(args.noise, args.replays, seed=1)
        return mod.twin(num, variant, DTYPE, {k: num.expand(v) for k, v in x.items()}, p)

    t_noisy = best_of(noisy, 1)
    shape = " x ".join(str(list(v.shape)) for v in inputs.values() if v.ndim > 1)[:25]
    gf = f"{flops / t_twin / 1e9:10.1f}" if flops else f"{'':>10}"
    return (f"{op + '/' + variant:<22}{shape:<26}{t_ref * 1e3:9.2f}{t_twin * 1e3:9.2f}{t_twin / t_ref:9.2f}"
            f"{args.replays / t_noisy:11.1f}{gf}")


if __name__ == "__main__":
    main()
