"""What per-replay draws cost a twin run, per op, isolated from the rest of the run.

    python bench/replay_draws.py [--repo PATH] [--ops geodesic,rmsnorm,...] [--cases 12] [--repeat 5]

Each replay of a noisy twin run draws from its own generator (optwin.twin.numerics.ReplayDraws), so a
run gives the same replays whatever its batch split. This records, per op, the sequence of per-replay
draws (shapes, kinds) that 16-replay stochastic runs of the build's default cases make, then replays
those sequences alone: once on ReplayDraws (the twin's draws) and once as one torch call per draw on a
single shared generator (what the draws cost before per-replay generators: the floor). The difference,
against the whole run's time, is what per-replay generators cost the run. One thread, CPU time, best of
--repeat: steadier than the build bench on a loaded machine. `--repo` measures another checkout (a
`git worktree` of a baseline) with this script.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

OPS = "geodesic,rmsnorm,layernorm,attention,softmax,rope,matmul"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--ops", default=OPS)
    ap.add_argument("--cases", type=int, default=12)
    ap.add_argument("--replays", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.repo))

    import torch

    torch.set_num_threads(1)
    from optwin import twin
    from optwin.catalog import all_triples
    from optwin.fingerprints.sources import generate
    from optwin.twin import numerics as N

    cpu = torch.device("cpu")
    print(f"{args.repo}: {args.cases} default cases per triple, {args.replays} stochastic replays, "
          f"best of {args.repeat} (CPU time, 1 thread), load {os.getloadavg()[0]:.1f}")
    print(f"{'op':10s} {'draws/run':>9s} {'run us':>8s} {'shared us':>9s} {'per-replay us':>13s} {'cost of run':>11s}")
    for op in args.ops.split(","):
        work = [(o, v, d, c) for o, v, d in all_triples() if o == op for c in generate("default", o, d, args.cases, 7)]
        runs: list[list[tuple[int | None, tuple[int, ...]]]] = []
        integers, uniform = N._integers, N._uniform

        def spy_i(gen, high, shape, device):
            if isinstance(gen, N.ReplayDraws) and gen._per_replay(shape):
                runs[-1].append((high, tuple(shape)))
            return integers(gen, high, shape, device)

        def spy_u(gen, shape, device, *a):
            if isinstance(gen, N.ReplayDraws) and gen._per_replay(shape):
                runs[-1].append((None, tuple(shape)))
            return uniform(gen, shape, device, *a)

        N._integers, N._uniform = spy_i, spy_u
        try:
            for o, v, d, c in work:
                runs.append([])
                twin.run(o, v, d, c.inputs, c.params, noise="stochastic", replays=args.replays, seed=1)
        finally:
            N._integers, N._uniform = integers, uniform

        def whole() -> None:
            for o, v, d, c in work:
                twin.run(o, v, d, c.inputs, c.params, noise="stochastic", replays=args.replays, seed=1)

        def per_replay() -> None:
            for seq in runs:
                draws = N.Numerics("stochastic", args.replays, 5).draws
                for high, shape in seq:
                    integers(draws, high, shape, cpu) if high else uniform(draws, shape, cpu)

        def shared() -> None:
            for seq in runs:
                g = torch.Generator().manual_seed(5)
                for high, shape in seq:
                    (torch.randint(0, high, shape, generator=g) if high
                     else torch.rand(shape, generator=g, dtype=torch.float64))

        def best(f) -> float:
            times = []
            for _ in range(args.repeat):
                t0 = time.process_time()
                f()
                times.append(time.process_time() - t0)
            return min(times) / len(runs) * 1e6

        t_run, t_shared, t_rep = best(whole), best(shared), best(per_replay)
        print(f"{op:10s} {sum(map(len, runs)) / len(runs):9.1f} {t_run:8.0f} {t_shared:9.0f} {t_rep:13.0f} "
              f"{(t_rep - t_shared) / t_run:+10.1%}")


if __name__ == "__main__":
    main()
